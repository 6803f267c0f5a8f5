//! Crash safety of the segment log: what was made durable is there after
//! reopening, a torn tail is cut off (a torn batch as a whole, whatever
//! order its bytes reached the disk in), and damage elsewhere stops the
//! node.

use oncekv_server::raft::segment_log::SegmentLog;
use oncekv_server::raft::type_config::TypeConfig;
use openraft::alias::{EntryOf, OneshotOf, VoteOf};
use openraft::async_runtime::Oneshot;
use openraft::storage::{IOFlushed, RaftLogReader, RaftLogStorage};
use openraft::testing::{blank_ent, log_id};
use openraft::vote::RaftLeaderId;
use std::path::Path;

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

async fn indexes(log: &mut SegmentLog) -> Vec<(u64, u64)> {
    log.try_get_log_entries(..)
        .await
        .expect("read")
        .iter()
        .map(|entry| (entry.log_id.leader_id.term(), entry.log_id.index))
        .collect()
}

fn segment(dir: &Path) -> std::path::PathBuf {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    files.sort();
    files.pop().expect("a segment")
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
    let expected: Vec<(u64, u64)> = (4..=6)
        .map(|i| (1, i))
        .chain((7..=8).map(|i| (2, i)))
        .collect();
    assert_eq!(indexes(&mut log).await, expected);
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
/// and returns the segment's bytes.
async fn one_frame_per_entry(dir: &Path, last: u64) -> Vec<u8> {
    let mut log = SegmentLog::open(dir).expect("open");
    for index in 1..=last {
        append(&mut log, blanks(1, index..=index)).await;
    }
    drop(log);
    std::fs::read(segment(dir)).expect("segment")
}

#[tokio::test]
async fn a_torn_tail_is_cut_off_at_every_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let whole = one_frame_per_entry(dir.path(), 3).await;
    let path = segment(dir.path());
    let other = tempfile::tempdir().expect("tempdir");
    let before_last = one_frame_per_entry(other.path(), 2).await.len();
    for cut in before_last..whole.len() {
        std::fs::write(&path, &whole[..cut]).expect("tear");
        let mut log = SegmentLog::open(dir.path()).expect("open torn log");
        assert_eq!(
            indexes(&mut log).await,
            vec![(1, 1), (1, 2)],
            "cut at byte {cut}"
        );
        assert_eq!(
            std::fs::metadata(&path).expect("meta").len() as usize,
            before_last
        );
    }
    // Garbage or zeroes after the last frame are cut too.
    for tail in [[0xff; 13], [0; 13]] {
        let mut garbage = whole.clone();
        garbage.extend_from_slice(&tail);
        std::fs::write(&path, &garbage).expect("garbage");
        let mut log = SegmentLog::open(dir.path()).expect("open");
        assert_eq!(indexes(&mut log).await, vec![(1, 1), (1, 2), (1, 3)]);
    }
}

/// After a power loss the disk may hold the end of the last write but not
/// its middle (pages reach the disk in any order until the sync). The
/// whole write was never acknowledged, so it is cut as a torn tail, not
/// taken for damage followed by intact records.
#[tokio::test]
async fn a_batch_whose_middle_never_reached_the_disk_is_cut_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let before = one_frame_per_entry(dir.path(), 2).await.len();
    {
        let mut log = SegmentLog::open(dir.path()).expect("open");
        append(&mut log, blanks(1, 3..=40)).await;
    }
    let path = segment(dir.path());
    let whole = std::fs::read(&path).expect("segment");
    let batch = whole.len() - before;
    for hole in [
        before..before + 8,
        before + batch / 3..before + batch / 2,
        whole.len() - 9..whole.len() - 1,
    ] {
        let mut torn = whole.clone();
        torn[hole.clone()].fill(0);
        std::fs::write(&path, &torn).expect("tear");
        let mut log = SegmentLog::open(dir.path()).expect("open torn log");
        assert_eq!(
            indexes(&mut log).await,
            vec![(1, 1), (1, 2)],
            "hole at {hole:?}"
        );
        assert_eq!(
            std::fs::metadata(&path).expect("meta").len() as usize,
            before
        );
    }
}

#[tokio::test]
async fn damage_before_intact_records_refuses_to_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut bytes = one_frame_per_entry(dir.path(), 5).await;
    let path = segment(dir.path());
    bytes[10] ^= 0x55;
    std::fs::write(&path, &bytes).expect("damage");
    let error = SegmentLog::open(dir.path()).expect_err("damaged log must not open");
    assert!(error.to_string().contains("damaged"), "{error}");
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
    let mut log = SegmentLog::open(dir.path()).expect("reopen");
    assert_eq!(indexes(&mut log).await.len(), 200);
}
