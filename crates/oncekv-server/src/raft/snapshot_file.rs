//! [`SnapshotFile`], openraft's `SnapshotData` for oncekv: a snapshot's
//! state-machine bytes, left in the file they were written to (the store's
//! snapshot file, or the spool file an incoming snapshot was received
//! into) and read from it in pieces when they are sent to a peer, restored
//! or copied, so a snapshot is never a buffer as large as the state.
//!
//! The handle is an open file, not a path: the file that is replaced by a
//! newer snapshot, or removed once its spool is done, keeps its bytes for
//! as long as a handle needs them (Unix semantics). Reads are positional,
//! so one handle serves any number of readers ([`SnapshotFile::share`]);
//! when the last of them closes a removed file, its blocks go back to the
//! file system a window at a time ([`ReleasingFile`]).
//!
//! A snapshot received from a peer is restored once, to check it before
//! openraft sees it; the state it restored to rides along
//! ([`SnapshotFile::with_restored`]) so the install takes it instead of
//! decoding the bytes a second time.

use super::gradual_release::ReleasingFile;
use oncekv_state::StateMachine;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A snapshot's state-machine bytes: `len` bytes from `offset` in `file`.
pub struct SnapshotFile {
    file: Arc<ReleasingFile>,
    offset: u64,
    len: u64,
    /// The state the bytes restore to, when it is already known.
    restored: Option<StateMachine>,
    /// Where the file is, when the bytes are all of it and the file may be
    /// taken over (moved) by the store that installs them.
    movable_from: Option<PathBuf>,
}

impl std::fmt::Debug for SnapshotFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotFile")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("restored", &self.restored.is_some())
            .field("movable_from", &self.movable_from)
            .finish()
    }
}

impl SnapshotFile {
    /// The `len` bytes from `offset` in `file` (open it for writing too,
    /// so that it can be released gradually once removed).
    pub fn new(file: File, offset: u64, len: u64) -> SnapshotFile {
        SnapshotFile {
            file: Arc::new(ReleasingFile::new(file)),
            offset,
            len,
            restored: None,
            movable_from: None,
        }
    }

    /// All of the file at `path`, which the store installing the bytes
    /// may move into place instead of copying them (a received snapshot's
    /// spool file).
    pub fn movable(path: &Path) -> io::Result<SnapshotFile> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let mut snapshot = SnapshotFile::whole(file)?;
        snapshot.movable_from = Some(path.to_path_buf());
        Ok(snapshot)
    }

    /// Where the file may be moved from, if it may ([`SnapshotFile::movable`]).
    pub fn movable_from(&self) -> Option<&Path> {
        self.movable_from.as_deref()
    }

    /// All of `file`, from its start.
    pub fn whole(file: File) -> io::Result<SnapshotFile> {
        let len = file.metadata()?.len();
        Ok(SnapshotFile::new(file, 0, len))
    }

    /// The same bytes through the same handle (not the state they restore
    /// to, nor the right to move the file).
    pub fn share(&self) -> SnapshotFile {
        SnapshotFile {
            file: Arc::clone(&self.file),
            offset: self.offset,
            len: self.len,
            restored: None,
            movable_from: None,
        }
    }

    /// Whether another handle ([`SnapshotFile::share`]) or a reader holds
    /// the file besides this one.
    pub fn is_shared(&self) -> bool {
        Arc::strong_count(&self.file) > 1
    }

    /// How many bytes the snapshot has.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the snapshot has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A reader of the bytes from their start.
    pub fn reader(&self) -> SnapshotReader {
        SnapshotReader {
            file: Arc::clone(&self.file),
            position: self.offset,
            end: self.offset.saturating_add(self.len),
        }
    }

    /// The bytes from `start`, at most `max` of them.
    pub fn read_piece(&self, start: u64, max: usize) -> io::Result<Vec<u8>> {
        let left = self.len.saturating_sub(start);
        let count = usize::try_from(left).unwrap_or(usize::MAX).min(max);
        let mut piece = vec![0; count];
        self.file
            .file()
            .read_exact_at(&mut piece, self.offset.saturating_add(start))?;
        Ok(piece)
    }

    /// The same bytes, with the state they restore to.
    pub fn with_restored(mut self, machine: StateMachine) -> SnapshotFile {
        self.restored = Some(machine);
        self
    }

    /// The state the bytes restore to, if it rides along.
    pub fn take_restored(&mut self) -> Option<StateMachine> {
        self.restored.take()
    }
}

/// Reads a [`SnapshotFile`]'s bytes in order (positional reads: readers
/// of one file do not disturb each other).
#[derive(Debug)]
pub struct SnapshotReader {
    file: Arc<ReleasingFile>,
    position: u64,
    end: u64,
}

impl Read for SnapshotReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.end.saturating_sub(self.position);
        let count = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
        if count == 0 {
            return Ok(0);
        }
        let read = self.file.file().read_at(&mut buf[..count], self.position)?;
        if read == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the snapshot file is shorter than its snapshot",
            ));
        }
        self.position = self.position.saturating_add(read as u64);
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    #[test]
    fn a_section_of_a_file_reads_whole_in_order_and_in_pieces() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let mut file = std::fs::File::create(&path).expect("create");
        file.write_all(b"headerSNAPSHOT-BYTEStrailer")
            .expect("write");
        let snapshot = SnapshotFile::new(std::fs::File::open(&path).expect("open"), 6, 14);
        // The path may go: the handle keeps the bytes.
        std::fs::remove_file(&path).expect("remove");
        let mut whole = Vec::new();
        snapshot
            .reader()
            .read_to_end(&mut whole)
            .expect("read whole");
        assert_eq!(whole, b"SNAPSHOT-BYTES");
        // Two readers at once do not disturb each other.
        let (mut a, mut b) = (snapshot.reader(), snapshot.reader());
        let mut first = [0u8; 4];
        a.read_exact(&mut first).expect("a");
        b.read_exact(&mut first).expect("b");
        assert_eq!(&first, b"SNAP");
        assert_eq!(snapshot.read_piece(9, 4).expect("piece"), b"BYTE");
        assert_eq!(snapshot.read_piece(12, 100).expect("last piece"), b"ES");
        assert!(
            snapshot
                .read_piece(14, 100)
                .expect("past the end")
                .is_empty()
        );
        assert_eq!(snapshot.len(), 14);
    }

    #[test]
    fn a_removed_file_keeps_its_bytes_until_the_last_shared_handle_drops() {
        use crate::raft::gradual_release::WINDOW_BYTES;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let len = WINDOW_BYTES + 4096;
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .expect("create");
        file.write_all(&vec![3u8; len as usize]).expect("write");
        let observer = File::open(&path).expect("open");
        let snapshot = SnapshotFile::new(file, 0, len);
        let shared = snapshot.share();
        std::fs::remove_file(&path).expect("remove");
        // The first handle goes: the shared one still reads every byte.
        drop(snapshot);
        let mut whole = Vec::new();
        shared.reader().read_to_end(&mut whole).expect("read");
        assert_eq!(whole.len() as u64, len);
        assert!(whole.iter().all(|&b| b == 3));
        // The last one goes: the file is released.
        drop(shared);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while observer.metadata().expect("stat").len() > 0 {
            assert!(std::time::Instant::now() < deadline, "not released");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
