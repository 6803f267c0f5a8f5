//! [`WriteBehind`]: writes a large file (a snapshot) to disk as it is
//! written, a window at a time, instead of leaving all of it dirty in the
//! page cache until the final `fsync`.
//!
//! A snapshot of a large state is a gigabyte. Written to the page cache
//! alone, the whole of it goes to the disk at the final `fsync`, and the
//! log's `fdatasync` calls meanwhile wait behind it (the file system
//! commits its journal only after writing the data that the commit
//! orders): writes stall for as long as the disk takes to write the
//! snapshot. Synced every [`WINDOW_BYTES`], the snapshot's dirty data never
//! exceeds a window, so a log sync waits for at most that much.

use std::fs::File;
use std::io::{self, Seek, SeekFrom, Write};

/// How many bytes may be written before they are synced: large enough that
/// the syncs cost little against the writing, small enough that the disk
/// writes one in milliseconds.
pub const WINDOW_BYTES: u64 = 8 << 20;

/// A file written through, synced every [`WINDOW_BYTES`] written (its data,
/// with `fdatasync`); the caller still syncs it all at the end.
#[derive(Debug)]
pub struct WriteBehind<'a> {
    file: &'a mut File,
    window: u64,
    /// Bytes written since the last sync.
    unsynced: u64,
}

impl<'a> WriteBehind<'a> {
    /// Writes to `file`, synced every [`WINDOW_BYTES`].
    pub fn new(file: &'a mut File) -> WriteBehind<'a> {
        WriteBehind::with_window(file, WINDOW_BYTES)
    }

    /// Writes to `file`, synced every `window` bytes.
    pub fn with_window(file: &'a mut File, window: u64) -> WriteBehind<'a> {
        WriteBehind {
            file,
            window,
            unsynced: 0,
        }
    }
}

impl Write for WriteBehind<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.file.write(buf)?;
        self.unsynced = self.unsynced.saturating_add(written as u64);
        if self.unsynced >= self.window {
            self.file.sync_data()?;
            self.unsynced = 0;
        }
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Seek for WriteBehind<'_> {
    fn seek(&mut self, position: SeekFrom) -> io::Result<u64> {
        self.file.seek(position)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn the_file_holds_what_was_written_across_windows_and_seeks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        let mut file = File::create(&path).unwrap();
        let mut expected = Vec::new();
        {
            let mut writer = WriteBehind::with_window(&mut file, 1000);
            for i in 0..100u32 {
                let piece = vec![(i % 251) as u8; 97];
                writer.write_all(&piece).unwrap();
                expected.extend_from_slice(&piece);
            }
            // 9,700 bytes in pieces of 97: synced after every 11 pieces
            // (1,067 bytes), so one piece is left unsynced.
            assert_eq!(writer.unsynced, 97);
            writer.seek(SeekFrom::Start(3)).unwrap();
            writer.write_all(b"abc").unwrap();
            expected[3..6].copy_from_slice(b"abc");
            writer.seek(SeekFrom::End(0)).unwrap();
            writer.write_all(b"end").unwrap();
            expected.extend_from_slice(b"end");
        }
        let mut read = Vec::new();
        File::open(&path).unwrap().read_to_end(&mut read).unwrap();
        assert_eq!(read, expected);
    }
}
