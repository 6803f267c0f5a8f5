//! Crash safety of the segment log, through its API and its files: what
//! was made durable is there after reopening; a torn tail (what a crash in
//! the middle of a write leaves, beyond what the segment's end record says
//! was synced) is cut off and the log goes on; damage to what was synced (a
//! flipped bit in any complete frame, a segment without its magic, a
//! missing segment) refuses to open, with a typed error naming the file and
//! the offset, and leaves the files as they are.

use oncekv_server::raft::segment_log::{DamageKind, LogDamage, SegmentLog};
use oncekv_server::raft::type_config::TypeConfig;
use openraft::alias::{EntryOf, OneshotOf, VoteOf};
use openraft::async_runtime::Oneshot;
use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
use openraft::testing::{blank_ent, log_id};
use openraft::vote::RaftLeaderId;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Bytes of the segment magic, of the segment header (the magic and the
/// two slots of the end record; frames start after it), and of a frame
/// header (the seal is one).
const MAGIC_BYTES: usize = 8;
const SEGMENT_HEADER_BYTES: usize = 1024;
const HEADER_BYTES: usize = 12;
/// The sector size the log assumes a disk writes whole.
const SECTOR_BYTES: usize = 512;

async fn append(log: &mut SegmentLog, entries: Vec<EntryOf<TypeConfig>>) {
    let (tx, rx) = <OneshotOf<TypeConfig> as Oneshot>::channel();
    log.append(entries, IOFlushed::signal(tx))
        .await
        .expect("append queued");
    rx.await.expect("callback fired").expect("append durable");
}

fn blanks(term: u64, range: std::ops::RangeInclusive<u64>) -> Vec<EntryOf<TypeConfig>> {
    range
        .map(|index| blank_ent::<TypeConfig>(term, 1, index))
        .collect()
}

async fn indexes(log: &mut SegmentLog) -> Vec<u64> {
    log.try_get_log_entries(..)
        .await
        .expect("read")
        .iter()
        .map(|entry| entry.log_id.index)
        .collect()
}

async fn open_indexes(dir: &Path) -> Vec<u64> {
    let mut log = SegmentLog::open(dir).expect("open");
    indexes(&mut log).await
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    files.sort();
    files
}

fn segment(dir: &Path) -> PathBuf {
    segments(dir).pop().expect("a segment")
}

/// The extents of a segment's frames with a body (seals left out), read
/// the way the module doc lays them out: the header (the magic `oncekvL3`
/// and the end record), then frames of `[length u32][body crc u32][header
/// crc u32][body]`.
fn data_frames(bytes: &[u8]) -> Vec<Range<usize>> {
    assert!(bytes.starts_with(b"oncekvL3"));
    let mut at = SEGMENT_HEADER_BYTES;
    let mut frames = Vec::new();
    while at + HEADER_BYTES <= bytes.len() {
        let length = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        let end = at + HEADER_BYTES + length;
        assert!(end <= bytes.len(), "a complete log");
        if length > 0 {
            frames.push(at..end);
        }
        at = end;
    }
    frames
}

/// A segment file's written part: the header, the frames and the seal,
/// without the zeros the log prepares after them for the frames to come.
fn written(path: &Path) -> Vec<u8> {
    let mut bytes = std::fs::read(path).expect("segment");
    let mut at = SEGMENT_HEADER_BYTES;
    while at + HEADER_BYTES <= bytes.len() && bytes[at..].iter().any(|byte| *byte != 0) {
        let length = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        at += HEADER_BYTES + length;
    }
    bytes.truncate(at.min(bytes.len()));
    bytes
}

/// The typed damage an open was refused with.
fn refusal(dir: &Path) -> (LogDamage, String) {
    let error = SegmentLog::open(dir).expect_err("a damaged log must not open");
    assert_eq!(error.kind(), std::io::ErrorKind::InvalidData, "{error}");
    let damage = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<LogDamage>())
        .unwrap_or_else(|| panic!("not a LogDamage: {error}"))
        .clone();
    (damage, error.to_string())
}

/// Asserts a refusal for damage in the frame at `offset` of `file`, named
/// in the message, and that the file was left as it was.
fn assert_refused_at(dir: &Path, file: &Path, damaged: &[u8], offset: usize) -> DamageKind {
    std::fs::write(file, damaged).expect("damage");
    let (damage, message) = refusal(dir);
    let LogDamage::Frame {
        file: named,
        offset: at,
        kind,
    } = damage
    else {
        panic!("not a frame's damage: {message}");
    };
    assert_eq!((named.as_path(), at), (file, offset as u64), "{message}");
    assert!(
        message.contains(&file.display().to_string())
            && message.contains(&format!("byte {offset}")),
        "{message}"
    );
    assert_eq!(
        std::fs::read(file).expect("segment"),
        damaged,
        "a refused log is left as it is"
    );
    kind
}

#[tokio::test]
async fn reopen_restores_entries_truncation_purge_and_vote() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut log = SegmentLog::open(dir.path()).expect("open");
        append(&mut log, blanks(1, 1..=10)).await;
        log.truncate_after(Some(log_id::<TypeConfig>(1, 1, 6)))
            .await
            .expect("truncate");
        append(&mut log, blanks(2, 7..=8)).await;
        log.purge(log_id::<TypeConfig>(1, 1, 3))
            .await
            .expect("purge");
        let vote = VoteOf::<TypeConfig>::new(2, 1);
        log.save_vote(&vote).await.expect("vote");
    }
    let mut log = SegmentLog::open(dir.path()).expect("reopen");
    let entries: Vec<(u64, u64)> = log
        .try_get_log_entries(..)
        .await
        .expect("read")
        .iter()
        .map(|entry| (entry.log_id.leader_id.term(), entry.log_id.index))
        .collect();
    let expected: Vec<(u64, u64)> = (4..=6)
        .map(|i| (1, i))
        .chain((7..=8).map(|i| (2, i)))
        .collect();
    assert_eq!(entries, expected);
    let state = log.get_log_state().await.expect("state");
    assert_eq!(
        state.last_purged_log_id,
        Some(log_id::<TypeConfig>(1, 1, 3))
    );
    assert_eq!(state.last_log_id, Some(log_id::<TypeConfig>(2, 1, 8)));
    assert_eq!(
        log.read_vote().await.expect("vote"),
        Some(VoteOf::<TypeConfig>::new(2, 1))
    );
}

/// Appends `1..=last` one entry per write (a frame each), closes the log,
/// and returns the segment's bytes: the frames, then the seal.
async fn one_frame_per_entry(dir: &Path, last: u64) -> Vec<u8> {
    one_frame_per_entry_in_flight(dir, last).await.0
}

/// As [`one_frame_per_entry`], and the segment's header as it was before
/// the last write: its end record says the frames before it were synced.
/// With it, the last write is what a power loss while it was written can
/// leave (the record after it never reached the disk), so it may be torn.
async fn one_frame_per_entry_in_flight(dir: &Path, last: u64) -> (Vec<u8>, Vec<u8>) {
    let mut log = SegmentLog::open(dir).expect("open");
    let mut header = Vec::new();
    for index in 1..=last {
        header = std::fs::read(segment(dir)).expect("segment")[..SEGMENT_HEADER_BYTES].to_vec();
        append(&mut log, blanks(1, index..=index)).await;
    }
    drop(log);
    (written(&segment(dir)), header)
}

/// `bytes` with `header` in place of their own.
fn with_header(header: &[u8], bytes: &[u8]) -> Vec<u8> {
    [header, &bytes[SEGMENT_HEADER_BYTES..]].concat()
}

#[tokio::test]
async fn a_torn_tail_is_cut_off_at_every_byte_and_the_log_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (whole, before) = one_frame_per_entry_in_flight(dir.path(), 3).await;
    let path = segment(dir.path());
    let last = data_frames(&whole)[2].clone();
    let seal = whole[last.end..].to_vec();
    assert_eq!(seal.len(), HEADER_BYTES, "the log ends with its seal");
    // The last write in flight: the end record from before it.
    let in_flight = with_header(&before, &whole);
    for cut in last.start..whole.len() {
        std::fs::write(&path, &in_flight[..cut]).expect("tear");
        // Once its frame is whole, opening syncs it and records it again.
        let (kept, sealed_end, header) = if cut < last.end {
            (vec![1, 2], last.start, &before[..])
        } else {
            (vec![1, 2, 3], last.end, &whole[..SEGMENT_HEADER_BYTES])
        };
        assert_eq!(open_indexes(dir.path()).await, kept, "cut at byte {cut}");
        let mut expected = with_header(header, &whole[..sealed_end]);
        expected.extend_from_slice(&seal);
        assert_eq!(
            written(&path),
            expected,
            "cut at byte {cut}: the torn tail is cut and the log sealed"
        );
    }
    // The log goes on after a cut.
    std::fs::write(&path, &in_flight[..last.start + 5]).expect("tear");
    {
        let mut log = SegmentLog::open(dir.path()).expect("open torn");
        append(&mut log, blanks(2, 3..=4)).await;
    }
    assert_eq!(open_indexes(dir.path()).await, vec![1, 2, 3, 4]);
}

/// Garbage after the last frame is a torn write, cut; zeros are the
/// space the log prepares for its next frames, kept.
#[tokio::test]
async fn garbage_after_the_last_frame_is_cut_and_zeroes_are_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let whole = one_frame_per_entry(dir.path(), 3).await;
    let path = segment(dir.path());
    for tail in [vec![0xff; 13], vec![0; 13], vec![0; 3 * SECTOR_BYTES]] {
        let mut garbage = whole.clone();
        garbage.extend_from_slice(&tail);
        std::fs::write(&path, &garbage).expect("garbage");
        assert_eq!(open_indexes(dir.path()).await, vec![1, 2, 3]);
        let opened = std::fs::read(&path).expect("segment");
        if tail[0] == 0 {
            assert_eq!(opened, garbage, "zeros kept");
        } else {
            assert_eq!(opened, whole, "cut");
        }
    }
}

/// After a power loss the disk may hold the end of the last write but not
/// its middle (sectors reach the disk in any order until the sync; one
/// that never did reads as zeros). That write was never synced, so there
/// is no seal after it, and the end record is the one before it: it is
/// cut as a torn tail, whole.
#[tokio::test]
async fn a_last_write_whose_sectors_never_reached_the_disk_is_cut_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let before = one_frame_per_entry(dir.path(), 2).await[..SEGMENT_HEADER_BYTES].to_vec();
    {
        let mut log = SegmentLog::open(dir.path()).expect("open");
        append(&mut log, blanks(1, 3..=800)).await;
    }
    let path = segment(dir.path());
    let sealed = with_header(&before, &written(&path));
    let unsealed = &sealed[..sealed.len() - HEADER_BYTES];
    let last = data_frames(unsealed)[2].clone();
    assert!(last.len() > 4 * SECTOR_BYTES, "the write spans sectors");
    let middle = (last.start + last.len() / 2).next_multiple_of(SECTOR_BYTES);
    let end_sector = (unsealed.len() - 1) / SECTOR_BYTES * SECTOR_BYTES;
    for hole in [
        last.start..last.start + HEADER_BYTES,
        middle..middle + SECTOR_BYTES,
        end_sector..unsealed.len(),
        middle..unsealed.len(),
    ] {
        let mut torn = unsealed.to_vec();
        torn[hole.clone()].fill(0);
        std::fs::write(&path, &torn).expect("tear");
        assert_eq!(
            open_indexes(dir.path()).await,
            vec![1, 2],
            "hole at {hole:?}"
        );
        let mut expected = unsealed[..last.start].to_vec();
        expected.extend_from_slice(&sealed[sealed.len() - HEADER_BYTES..]);
        assert_eq!(written(&path), expected);
    }
}

/// The attack that found the bug: one flipped bit in the last frame, which
/// was synced and acknowledged, was taken for a torn write and the write
/// silently lost. Sealed (as the log is left after any stop) or not (the
/// seal lost with the page cache), it is refused, naming file and offset.
#[tokio::test]
async fn a_flipped_bit_in_the_last_complete_frame_is_refused_naming_file_and_offset() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sealed = one_frame_per_entry(dir.path(), 3).await;
    let path = segment(dir.path());
    let last = data_frames(&sealed)[2].clone();
    for log in [&sealed[..], &sealed[..last.end]] {
        for (byte, bit) in [(last.start + HEADER_BYTES, 0), (last.end - 1, 7)] {
            let mut damaged = log.to_vec();
            damaged[byte] ^= 1 << bit;
            let kind = assert_refused_at(dir.path(), &path, &damaged, last.start);
            assert_eq!(
                kind,
                DamageKind::FlippedBodyBit {
                    byte: byte as u64,
                    bit
                }
            );
        }
        // In its header.
        let mut damaged = log.to_vec();
        damaged[last.start + 1] ^= 0x08;
        let kind = assert_refused_at(dir.path(), &path, &damaged, last.start);
        assert_eq!(
            kind,
            DamageKind::FlippedHeaderBit {
                byte: (last.start + 1) as u64,
                bit: 3
            }
        );
    }
}

#[tokio::test]
async fn a_flipped_bit_in_a_middle_frame_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let whole = one_frame_per_entry(dir.path(), 5).await;
    let path = segment(dir.path());
    let middle = data_frames(&whole)[2].clone();
    let mut damaged = whole.clone();
    damaged[middle.end - 2] ^= 0x40;
    let kind = assert_refused_at(dir.path(), &path, &damaged, middle.start);
    assert!(
        matches!(kind, DamageKind::FlippedBodyBit { .. }),
        "{kind:?}"
    );
}

#[tokio::test]
async fn a_destroyed_header_before_intact_frames_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let whole = one_frame_per_entry(dir.path(), 5).await;
    let path = segment(dir.path());
    let first = data_frames(&whole)[0].clone();
    let mut damaged = whole.clone();
    damaged[first.start + 2] ^= 0x55;
    let kind = assert_refused_at(dir.path(), &path, &damaged, first.start);
    assert_eq!(kind, DamageKind::HeaderChecksum);
}

#[tokio::test]
async fn a_segment_without_the_magic_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut bytes = one_frame_per_entry(dir.path(), 3).await;
    let path = segment(dir.path());
    bytes[..MAGIC_BYTES].fill(0);
    std::fs::write(&path, &bytes).expect("damage");
    let (damage, message) = refusal(dir.path());
    assert_eq!(damage, LogDamage::NoMagic { file: path.clone() });
    assert!(message.contains(&path.display().to_string()), "{message}");
}

#[tokio::test]
async fn a_missing_segment_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    one_frame_per_entry(dir.path(), 3).await;
    let first = segment(dir.path());
    assert!(first.ends_with("0000000000.log"));

    // A gap: segments 0 and 2, but not 1.
    let third = dir.path().join("0000000002.log");
    std::fs::copy(&first, &third).expect("copy");
    let (damage, message) = refusal(dir.path());
    assert!(
        matches!(
            damage,
            LogDamage::MissingSegments {
                first: 1,
                last: 1,
                ..
            }
        ),
        "{message}"
    );
    assert!(message.contains("0000000001.log"), "{message}");

    // The first one gone, and nothing was purged: not a restart from a
    // snapshot, a refusal.
    std::fs::remove_file(&third).expect("remove");
    std::fs::rename(&first, dir.path().join("0000000001.log")).expect("rename");
    let (damage, message) = refusal(dir.path());
    assert!(
        matches!(
            damage,
            LogDamage::MissingSegments {
                first: 0,
                last: 0,
                ..
            }
        ),
        "{message}"
    );
    assert!(message.contains("0000000000.log"), "{message}");
}

#[tokio::test]
async fn appends_survive_reopen_after_many_batches() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut log = SegmentLog::open(dir.path()).expect("open");
        for start in (1..=200).step_by(10) {
            append(&mut log, blanks(1, start..=start + 9)).await;
        }
    }
    assert_eq!(open_indexes(dir.path()).await.len(), 200);
}

/// A follower's append that finds the writer idle is written and synced
/// before `append` returns (its callback has fired), and survives a
/// reopen like any other.
#[tokio::test]
async fn an_idle_followers_append_is_durable_when_append_returns() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut log = SegmentLog::open(dir.path()).expect("open");
        // Node 2 follows: the entries are led by node 1.
        log.set_local_node(2);
        for index in 1..=5 {
            let (tx, mut rx) = <OneshotOf<TypeConfig> as Oneshot>::channel();
            log.append(blanks(1, index..=index), IOFlushed::signal(tx))
                .await
                .expect("append");
            rx.try_recv()
                .expect("synced on the caller's thread before append returned")
                .expect("append durable");
        }
        log.save_vote(&VoteOf::<TypeConfig>::new(2, 1))
            .await
            .expect("vote");
    }
    let mut log = SegmentLog::open(dir.path()).expect("reopen");
    assert_eq!(indexes(&mut log).await, (1..=5).collect::<Vec<_>>());
    assert_eq!(
        log.read_vote().await.expect("vote"),
        Some(VoteOf::<TypeConfig>::new(2, 1))
    );
}

/// Appends queued without waiting (as openraft's leader does) while votes
/// are saved from other threads: every write survives a reopen, in order,
/// whether the appends go to the writer thread (this node leads them) or
/// may be written by their caller (it follows).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_appends_and_votes_all_survive() {
    for local_node in [1, 2] {
        let dir = tempfile::tempdir().expect("tempdir");
        let last_index = 300;
        let last_term = 40;
        {
            let log = SegmentLog::open(dir.path()).expect("open");
            log.set_local_node(local_node);
            let mut appender = log.clone();
            let appends = tokio::spawn(async move {
                let mut callbacks = Vec::new();
                for index in 1..=last_index {
                    let (tx, rx) = <OneshotOf<TypeConfig> as Oneshot>::channel();
                    appender
                        .append(blanks(1, index..=index), IOFlushed::signal(tx))
                        .await
                        .expect("append");
                    callbacks.push(rx);
                }
                for rx in callbacks {
                    rx.await.expect("callback fired").expect("append durable");
                }
            });
            let voters: Vec<_> = (0..2)
                .map(|voter| {
                    let mut log = log.clone();
                    tokio::spawn(async move {
                        for term in (1..=last_term).filter(|term| term % 2 == voter) {
                            log.save_vote(&VoteOf::<TypeConfig>::new(term, 1))
                                .await
                                .expect("vote");
                        }
                    })
                })
                .collect();
            appends.await.expect("appends");
            for voter in voters {
                voter.await.expect("votes");
            }
            let mut log = log;
            log.save_vote(&VoteOf::<TypeConfig>::new(last_term + 1, 1))
                .await
                .expect("last vote");
        }
        let mut log = SegmentLog::open(dir.path()).expect("reopen");
        assert_eq!(
            indexes(&mut log).await,
            (1..=last_index).collect::<Vec<_>>(),
            "local node {local_node}"
        );
        assert_eq!(
            log.read_vote().await.expect("vote"),
            Some(VoteOf::<TypeConfig>::new(last_term + 1, 1)),
            "the vote saved last is the one on disk"
        );
    }
}
