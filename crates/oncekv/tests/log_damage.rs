//! A real `oncekv serve` whose log was damaged on disk while it was
//! stopped: one flipped bit in the last complete frame of its last segment
//! (a synced, acknowledged write), its last segment truncated, its only
//! segment deleted. It must refuse to start, with a non-zero exit code and
//! a message naming what is damaged, rather than take the damage for a
//! torn write (or an empty log) and silently drop acknowledged writes.

mod support;

use oncekv_state::{Command, Outcome, Request};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;
use support::{Cluster, FAST, eventually};

/// Bytes of the segment header and of a frame header, as the segment log's
/// module doc lays a segment out: the header (the magic `oncekvL3` and the
/// end record's two slots), then frames of `[length u32][body crc
/// u32][header crc u32][body]`; an empty body is a seal.
const SEGMENT_HEADER_BYTES: usize = 1024;
const HEADER_BYTES: usize = 12;

/// The last segment file in a node's log directory.
fn last_segment(log_dir: &Path) -> PathBuf {
    let mut segments: Vec<PathBuf> = std::fs::read_dir(log_dir)
        .expect("log dir")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "log"))
        .collect();
    segments.sort();
    segments.pop().expect("a segment")
}

/// Where the last frame with a body lies in a segment.
fn last_complete_frame(bytes: &[u8]) -> Range<usize> {
    assert!(bytes.starts_with(b"oncekvL3"), "a segment of this version");
    let mut at = SEGMENT_HEADER_BYTES;
    let mut last = None;
    while at + HEADER_BYTES <= bytes.len() {
        let length = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        let end = at + HEADER_BYTES + length;
        if end > bytes.len() {
            break;
        }
        if length > 0 {
            last = Some(at..end);
        }
        at = end;
    }
    last.expect("a frame with a body")
}

fn put(index: usize) -> Request {
    Request::plain(Command::Put {
        key: format!("key{index}").into_bytes(),
        value: (format!("value{index}").into_bytes()).into(),
        lease: None,
    })
}

/// A single node with `count` acknowledged puts, killed: its data dir holds
/// what it synced.
async fn node_with_acknowledged_puts(count: usize) -> Cluster {
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(20)).await;
    for index in 0..count {
        let outcome = cluster.outcome(&put(index), Duration::from_secs(20)).await;
        assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
    }
    cluster.node(1).kill();
    cluster
}

/// Restarts node 1, which must refuse to start: exit code 10 (data
/// directory unusable), its log saying `expected`. Returns the logs.
async fn refuses_to_start(cluster: &mut Cluster, expected: &str) -> String {
    cluster.node(1).spawn();
    let mut child = cluster.node(1).child.take().expect("started");
    let status = eventually(Duration::from_secs(30), "the node to stop", || {
        let exited = child.try_wait().expect("wait");
        async move { exited }
    })
    .await;
    let log = cluster.logs();
    assert!(!status.success(), "started on a damaged log:\n{log}");
    assert_eq!(
        status.code(),
        Some(10),
        "exit code 10, data directory unusable:\n{log}"
    );
    assert!(
        log.contains(expected),
        "no message saying {expected:?}:\n{log}"
    );
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_bit_in_the_last_frame_stops_the_node_from_starting() {
    let _one = support::exclusive().await;
    let mut cluster = node_with_acknowledged_puts(5).await;

    let segment = last_segment(&cluster.node(1).data_dir.join("log"));
    let mut bytes = std::fs::read(&segment).expect("segment");
    let last = last_complete_frame(&bytes);
    let body = last.start + HEADER_BYTES..last.end;
    bytes[body.start + body.len() / 2] ^= 0x10;
    std::fs::write(&segment, &bytes).expect("flip a bit");

    let named = format!(
        "log segment {} is damaged: the frame at byte {}",
        segment.display(),
        last.start
    );
    refuses_to_start(&mut cluster, &named).await;
    assert_eq!(
        std::fs::read(&segment).expect("segment"),
        bytes,
        "the damaged log was left as it was"
    );
}

/// The last segment truncated to half its length: the frames it lost were
/// synced and acknowledged, and its end record says so. Not a torn write:
/// refused, naming the file, the synced end and what is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_last_segment_stops_the_node_from_starting() {
    let _one = support::exclusive().await;
    let mut cluster = node_with_acknowledged_puts(40).await;

    let segment = last_segment(&cluster.node(1).data_dir.join("log"));
    let whole = std::fs::read(&segment).expect("segment");
    // Half of what was written: the zeros the log prepares for its next
    // frames follow the seal, which ends in a nonzero checksum.
    let written = whole
        .iter()
        .rposition(|byte| *byte != 0)
        .map_or(0, |at| at + 1);
    let half = written / 2;
    assert!(
        half > SEGMENT_HEADER_BYTES,
        "frames past the header: {} bytes",
        whole.len()
    );
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .expect("segment");
    file.set_len(half as u64).expect("truncate");
    drop(file);

    let named = format!(
        "log segment {} ends before its synced end: its end record says it was synced through byte",
        segment.display()
    );
    let log = refuses_to_start(&mut cluster, &named).await;
    assert!(
        log.contains(&format!("the file is {half} bytes long")),
        "{log}"
    );
    assert_eq!(
        std::fs::read(&segment).expect("segment"),
        whole[..half],
        "the truncated log was left as it was"
    );
}

/// The only segment deleted: the node voted (it elected itself), so it had
/// a log; it does not start as a node with an empty one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_only_segment_stops_the_node_from_starting() {
    let _one = support::exclusive().await;
    let mut cluster = node_with_acknowledged_puts(5).await;

    let log_dir = cluster.node(1).data_dir.join("log");
    let segment = last_segment(&log_dir);
    assert!(
        segment.ends_with("0000000000.log"),
        "one segment: {segment:?}"
    );
    std::fs::remove_file(&segment).expect("delete the segment");

    let named = format!(
        "log segments missing: {} has a vote but no segment",
        log_dir.display()
    );
    refuses_to_start(&mut cluster, &named).await;
    assert!(!segment.exists(), "nothing was created in its place");
}
