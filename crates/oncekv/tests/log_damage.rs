//! A real `oncekv serve` whose log was damaged on disk while it was
//! stopped: one flipped bit in the last complete frame of its last segment
//! (a synced, acknowledged write). It must refuse to start, with a non-zero
//! exit code and a message naming the file and the offset, rather than take
//! the damage for a torn write and silently drop the write.

mod support;

use oncekv_state::{Command, Outcome, Request};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;
use support::{Cluster, FAST, eventually};

/// Bytes of the segment magic and of a frame header, as the segment log's
/// module doc lays a segment out: the magic, then frames of `[length
/// u32][body crc u32][header crc u32][body]`; an empty body is a seal.
const MAGIC_BYTES: usize = 8;
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
    let mut at = MAGIC_BYTES;
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
        value: format!("value{index}").into_bytes(),
        lease: None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flipped_bit_in_the_last_frame_stops_the_node_from_starting() {
    let _one = support::exclusive().await;
    let mut cluster = Cluster::start(1, FAST);
    cluster.leader(Duration::from_secs(20)).await;
    for index in 0..5 {
        let outcome = cluster.outcome(&put(index), Duration::from_secs(20)).await;
        assert!(matches!(outcome, Outcome::Applied(_)), "{outcome:?}");
    }
    cluster.node(1).kill();

    let segment = last_segment(&cluster.node(1).data_dir.join("log"));
    let mut bytes = std::fs::read(&segment).expect("segment");
    let last = last_complete_frame(&bytes);
    let body = last.start + HEADER_BYTES..last.end;
    bytes[body.start + body.len() / 2] ^= 0x10;
    std::fs::write(&segment, &bytes).expect("flip a bit");

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
    let named = format!(
        "log segment {} is damaged: the frame at byte {}",
        segment.display(),
        last.start
    );
    assert!(log.contains(&named), "no message naming the damage:\n{log}");
    assert_eq!(
        std::fs::read(&segment).expect("segment"),
        bytes,
        "the damaged log was left as it was"
    );
}
