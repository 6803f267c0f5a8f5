//! Crash safety of the segment log: what was made durable is there after
//! reopening, a torn tail is cut off, and damage elsewhere stops the node.

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

#[tokio::test]
async fn a_torn_tail_is_cut_off_at_every_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut log = SegmentLog::open(dir.path()).expect("open");
        append(&mut log, blanks(1, 1..=3)).await;
    }
    let path = segment(dir.path());
    let whole = std::fs::read(&path).expect("segment");
    let before_last = {
        let mut log = SegmentLog::open(dir.path()).expect("open");
        drop(indexes(&mut log).await);
        // Size of the first two records: write them alone elsewhere.
        let other = tempfile::tempdir().expect("tempdir");
        let mut two = SegmentLog::open(other.path()).expect("open");
        append(&mut two, blanks(1, 1..=2)).await;
        std::fs::read(segment(other.path())).expect("segment").len()
    };
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
    // Garbage after the last record is cut too.
    let mut garbage = whole.clone();
    garbage.extend_from_slice(&[0xff; 13]);
    std::fs::write(&path, &garbage).expect("garbage");
    let mut log = SegmentLog::open(dir.path()).expect("open");
    assert_eq!(indexes(&mut log).await, vec![(1, 1), (1, 2), (1, 3)]);
}

#[tokio::test]
async fn damage_before_intact_records_refuses_to_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let mut log = SegmentLog::open(dir.path()).expect("open");
        append(&mut log, blanks(1, 1..=5)).await;
    }
    let path = segment(dir.path());
    let mut bytes = std::fs::read(&path).expect("segment");
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
