//! [`ReleasingFile`] and [`release_gradually`]: give a large removed
//! file's blocks back to the file system a window at a time, on a thread
//! of their own, instead of all at once when it is closed.
//!
//! A replaced snapshot, a sent backup and a purged log segment are removed
//! files whose blocks the kernel frees when the last handle closes: a
//! gigabyte in one journal transaction. On a file system that discards
//! freed blocks (ext4 mounted with `discard`, common on virtual disks), the
//! next journal commit then discards the gigabyte, and every log
//! `fdatasync` meanwhile waits for that commit: measured on one node
//! holding 1,000,000 keys of 1 KiB, replacing its 1 GiB snapshot held the
//! log's syncs for 150 ms. Shrunk from its end a window at a time, each
//! step synced (one commit each), a log sync waits for one window's worth.
//!
//! Shrinking changes the file for every handle on it, so only a file that
//! is no longer linked is shrunk, and the store shares one handle on its
//! snapshot file between all its readers (the last of them to close it
//! releases it).

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt as _;

/// How many bytes one step frees: few enough that discarding them takes
/// milliseconds, many enough that a gigabyte takes about a hundred steps.
/// Files no larger are closed at once.
pub const WINDOW_BYTES: u64 = 8 << 20;

/// A file that, when dropped after it was removed (no name links to it),
/// is shrunk away a window at a time on a thread of its own
/// ([`release_gradually`]). A file still linked closes as any file does.
#[derive(Debug)]
pub struct ReleasingFile(Option<File>);

impl ReleasingFile {
    /// Wraps `file`: open it for writing, or it cannot be shrunk (it is
    /// then closed at once, as any file).
    pub fn new(file: File) -> ReleasingFile {
        ReleasingFile(Some(file))
    }

    /// The file.
    pub fn file(&self) -> &File {
        // Taken only by `drop`.
        self.0
            .as_ref()
            .expect("a ReleasingFile holds its file until dropped")
    }
}

impl Drop for ReleasingFile {
    fn drop(&mut self) {
        let Some(file) = self.0.take() else { return };
        match file.metadata() {
            Ok(meta) if meta.nlink() == 0 && meta.len() > WINDOW_BYTES => {
                release_gradually(vec![file])
            }
            _ => drop(file),
        }
    }
}

/// Shrinks `files` away ([`shrink_away`]), one after the other, on a
/// thread of their own, closing each: for removed files nothing else uses.
/// Small files, and files the thread cannot be started for, are closed at
/// once.
pub fn release_gradually(files: Vec<File>) {
    let large: Vec<File> = files
        .into_iter()
        .filter(|file| file.metadata().is_ok_and(|m| m.len() > WINDOW_BYTES))
        .collect();
    if large.is_empty() {
        return;
    }
    let started = std::thread::Builder::new()
        .name("oncekv-release".into())
        .spawn(move || {
            for file in large {
                if let Err(error) = shrink_away(&file, WINDOW_BYTES) {
                    // Closing it frees the rest at once.
                    tracing::debug!(%error, "releasing a removed file gradually failed");
                }
            }
        });
    if let Err(error) = started {
        tracing::debug!(%error, "no thread to release removed files gradually");
    }
}

/// Truncates `file` from its end, `window` bytes at a time, syncing each
/// step so that each frees its blocks in a journal commit of its own.
pub fn shrink_away(file: &File, window: u64) -> io::Result<()> {
    let mut len = file.metadata()?.len();
    while len > 0 {
        len = len.saturating_sub(window.max(1));
        file.set_len(len)?;
        file.sync_data()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;
    use std::time::{Duration, Instant};

    fn file_of(path: &std::path::Path, len: u64) -> File {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .unwrap();
        let block = vec![7u8; 1 << 20];
        let mut left = len;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            file.write_all(&block[..n]).unwrap();
            left -= n as u64;
        }
        file
    }

    #[test]
    fn shrinking_away_leaves_an_empty_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = file_of(&dir.path().join("f"), 10_000);
        shrink_away(&file, 3_000).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 0);
    }

    #[test]
    fn a_removed_file_is_shrunk_after_its_last_handle_drops_and_a_linked_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let len = WINDOW_BYTES + (1 << 20);
        // Still linked: closed as it is.
        let linked = dir.path().join("linked");
        drop(ReleasingFile::new(file_of(&linked, len)));
        assert_eq!(std::fs::metadata(&linked).unwrap().len(), len);
        // Removed: shrunk. Another handle, opened apart (which is why the
        // store shares one handle), sees it shrink.
        let removed = dir.path().join("removed");
        let releasing = ReleasingFile::new(file_of(&removed, len));
        let observer = File::open(&removed).unwrap();
        std::fs::remove_file(&removed).unwrap();
        assert_eq!(observer.metadata().unwrap().len(), len);
        drop(releasing);
        let deadline = Instant::now() + Duration::from_secs(60);
        while observer.metadata().unwrap().len() > 0 {
            assert!(Instant::now() < deadline, "the removed file was not shrunk");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_file_opened_to_read_only_is_closed_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        drop(file_of(&path, WINDOW_BYTES + 1));
        let read_only = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(shrink_away(&read_only, WINDOW_BYTES).is_err());
        drop(ReleasingFile::new(read_only));
    }
}
