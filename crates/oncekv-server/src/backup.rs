//! Backups: a consistent copy of the replicated state (taken on the
//! leader after a read barrier, so it holds every acknowledged write), as a
//! file naming the index it was taken at and the SHA-256 of its contents;
//! and the restore that seeds a new node's data directory from it, so a
//! new cluster starts with the same data, sessions, completion records and
//! users (a retry after a restore is still answered from its record).
//! A node makes a backup into a file of its own in its state directory and
//! sends it from there in pieces ([`BackupFile`]): never a buffer as large
//! as the state.
//!
//! File layout: `b"OKVBKUP1"`, the applied index (u64 LE), the SHA-256 of
//! the body (32 bytes), then the body: the state machine's own snapshot
//! bytes (with their magic, format version and checksum). A file saved
//! through etcd's API (`etcdctl snapshot save`) is the same bytes, padded
//! with zeros and their length to whole 512-byte pages, then the SHA-256
//! of all of them, as etcd ends its snapshot stream; it is read as well
//! ([`Backup::decode`]).

use crate::raft::seed::{SeedError, seed};
use crate::raft::snapshot_file::SnapshotFile;
use crate::raft::type_config::{NodeId, NodeInfo};
use crate::raft::write_behind::WriteBehind;
use oncekv_state::{Limits, LogIndex, StateMachine};
use sha2::{Digest as _, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"OKVBKUP1";
const HEADER_BYTES: usize = 8 + 8 + 32;
/// What etcd's clients expect a snapshot's length (less its trailing
/// SHA-256) to be a multiple of.
const ETCD_PAGE_BYTES: usize = 512;

/// The backup file inside bytes saved through etcd's API, if they are
/// such: a trailing SHA-256 of the rest, before it the backup's length,
/// and zeros between the backup and its length.
fn unwrap_etcd(bytes: &[u8]) -> Option<&[u8]> {
    let end = bytes.len().checked_sub(32)?;
    if Sha256::digest(&bytes[..end]).as_slice() != &bytes[end..] {
        return None;
    }
    let length_at = end.checked_sub(8)?;
    let mut length = [0u8; 8];
    length.copy_from_slice(&bytes[length_at..end]);
    let length = usize::try_from(u64::from_le_bytes(length)).ok()?;
    let padding = bytes.get(length..length_at)?;
    padding
        .iter()
        .all(|byte| *byte == 0)
        .then(|| &bytes[..length])
}

/// A backup: the state machine's snapshot bytes and where they were taken.
#[derive(Clone, PartialEq, Eq)]
pub struct Backup {
    /// The log index of the last entry the state includes.
    pub applied_index: LogIndex,
    /// The state machine's snapshot bytes.
    pub state: Vec<u8>,
}

impl std::fmt::Debug for Backup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backup")
            .field("applied_index", &self.applied_index.0)
            .field("bytes", &self.state.len())
            .finish()
    }
}

/// Why a backup could not be read or restored.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// Not a backup file.
    #[error("not an oncekv backup (bad magic or too short)")]
    BadMagic,
    /// The contents do not match their SHA-256: damaged or cut short.
    #[error("the backup's SHA-256 does not match its contents: damaged or truncated")]
    Checksum,
    /// The state inside does not restore.
    #[error("the state in the backup does not restore: {0}")]
    State(#[from] oncekv_state::SnapshotError),
    /// The backup's index disagrees with its state.
    #[error("the backup names index {named} but its state was taken at {found:?}")]
    IndexMismatch {
        /// The index the header names.
        named: u64,
        /// The state's last applied index.
        found: Option<u64>,
    },
    /// The data directory already holds data.
    #[error("{0} is not empty: restore into a new data directory")]
    NotEmpty(PathBuf),
    /// This node is not among the members.
    #[error("node {0} is not in the initial cluster")]
    NotAMember(NodeId),
    /// The data directory could not be written.
    #[error("writing {path}: {source}")]
    Io {
        /// What was being written.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The node's storage could not be seeded with it.
    #[error(transparent)]
    Seed(#[from] SeedError),
}

impl Backup {
    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(HEADER_BYTES + self.state.len());
        bytes.extend_from_slice(&Backup::header(
            self.applied_index,
            &Sha256::digest(&self.state).into(),
        ));
        bytes.extend_from_slice(&self.state);
        bytes
    }

    /// How many bytes come before the state in a backup file.
    pub const HEADER_BYTES: u64 = HEADER_BYTES as u64;

    /// The bytes before the state in a backup file of a state taken at
    /// `applied_index` whose SHA-256 is `sha256`.
    pub fn header(applied_index: LogIndex, sha256: &[u8; 32]) -> [u8; HEADER_BYTES] {
        let mut header = [0u8; HEADER_BYTES];
        header[..8].copy_from_slice(MAGIC);
        header[8..16].copy_from_slice(&applied_index.0.to_le_bytes());
        header[16..].copy_from_slice(sha256);
        header
    }

    /// Checks a backup file (of [`Backup::encode`]'s layout) without
    /// holding its bytes: the magic, the SHA-256 of the state, read a piece
    /// at a time, and that the state restores, read from the file, to the
    /// index the header names.
    pub fn check_file(path: &Path) -> Result<(), BackupError> {
        use std::io::{BufReader, Read as _, Seek as _, SeekFrom};
        let io = |source| BackupError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = std::fs::File::open(path).map_err(io)?;
        let mut header = [0u8; HEADER_BYTES];
        file.read_exact(&mut header)
            .map_err(|_| BackupError::BadMagic)?;
        if &header[..8] != MAGIC {
            return Err(BackupError::BadMagic);
        }
        let mut index = [0u8; 8];
        index.copy_from_slice(&header[8..16]);
        let named = u64::from_le_bytes(index);
        let mut hasher = Sha256::new();
        std::io::copy(
            &mut BufReader::with_capacity(1 << 20, &mut file),
            &mut hasher,
        )
        .map_err(io)?;
        if hasher.finalize().as_slice() != &header[16..] {
            return Err(BackupError::Checksum);
        }
        let state = |file: &mut std::fs::File| {
            file.seek(SeekFrom::Start(Backup::HEADER_BYTES))?;
            Ok::<_, std::io::Error>(BufReader::with_capacity(1 << 20, file.try_clone()?))
        };
        let limits = StateMachine::snapshot_limits_from(state(&mut file).map_err(io)?)?;
        let machine = StateMachine::restore_from(&limits, state(&mut file).map_err(io)?)?;
        if machine.last_applied() != Some(LogIndex(named)) {
            return Err(BackupError::IndexMismatch {
                named,
                found: machine.last_applied().map(|i| i.0),
            });
        }
        Ok(())
    }

    /// The SHA-256 of the state, in hex (what `snapshot save` prints).
    pub fn sha256_hex(&self) -> String {
        hex::encode(Sha256::digest(&self.state))
    }

    /// The bytes etcd's API streams for it: the file's bytes, zeros and
    /// their length (u64 LE) up to a multiple of 512 bytes (etcd's clients
    /// check that a snapshot is whole pages), then the SHA-256 of all that.
    pub fn encode_for_etcd(&self) -> Vec<u8> {
        let mut bytes = self.encode();
        let length = bytes.len();
        let padded = length.saturating_add(8).next_multiple_of(ETCD_PAGE_BYTES);
        bytes.resize(padded - 8, 0);
        bytes.extend_from_slice(&(length as u64).to_le_bytes());
        let sha = Sha256::digest(&bytes);
        bytes.extend_from_slice(&sha);
        bytes
    }

    /// Reads a backup file's bytes, checking its magic and SHA-256; a file
    /// saved through etcd's API ([`Backup::encode_for_etcd`]) is read
    /// without its padding and trailing SHA-256.
    pub fn decode(bytes: &[u8]) -> Result<Backup, BackupError> {
        let bytes = unwrap_etcd(bytes).unwrap_or(bytes);
        if bytes.len() < HEADER_BYTES || &bytes[..8] != MAGIC {
            return Err(BackupError::BadMagic);
        }
        let mut index = [0u8; 8];
        index.copy_from_slice(&bytes[8..16]);
        let state = &bytes[HEADER_BYTES..];
        if Sha256::digest(state).as_slice() != &bytes[16..HEADER_BYTES] {
            return Err(BackupError::Checksum);
        }
        Ok(Backup {
            applied_index: LogIndex(u64::from_le_bytes(index)),
            state: state.to_vec(),
        })
    }

    /// The limits the state was taken under: a restored cluster runs with
    /// them (`serve` refuses a snapshot taken under other limits).
    pub fn limits(&self) -> Result<Limits, BackupError> {
        Ok(StateMachine::snapshot_limits(&self.state)?)
    }

    /// Checks that the state restores, to the index the header names.
    pub fn check(&self) -> Result<StateMachine, BackupError> {
        let machine = StateMachine::restore(&self.limits()?, &self.state)?;
        if machine.last_applied() != Some(self.applied_index) {
            return Err(BackupError::IndexMismatch {
                named: self.applied_index.0,
                found: machine.last_applied().map(|i| i.0),
            });
        }
        Ok(machine)
    }
}

/// The name, in the state's directory, of the file a backup is written to
/// before it is sent (removed from the directory as soon as it is open).
const BACKUP_FILE: &str = "backup.tmp";

/// A backup this node made, to be sent: the state's snapshot bytes in a
/// file of their own (already removed from its directory, so it goes with
/// the last handle, also after a crash), their SHA-256 and the index they
/// were taken at. It is read a piece at a time as it is sent, so a backup is
/// never a buffer as large as the state.
#[derive(Debug)]
pub struct BackupFile {
    applied_index: LogIndex,
    state: SnapshotFile,
    sha256: [u8; 32],
}

impl BackupFile {
    /// Writes `machine`'s snapshot bytes to a file in `dir` (synced as it
    /// goes, see [`WriteBehind`], so the log's syncs do not wait behind
    /// it), then reads them back for their SHA-256. Blocks: call it off the
    /// async threads, one at a time per directory.
    pub fn make(machine: &StateMachine, dir: &Path) -> std::io::Result<BackupFile> {
        let path = dir.join(BACKUP_FILE);
        let mut file = crate::private_fs::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        std::fs::remove_file(&path)?;
        let len = machine.write_snapshot(&mut WriteBehind::new(&mut file))?;
        let state = SnapshotFile::new(file, 0, len);
        let mut hasher = Sha256::new();
        std::io::copy(
            &mut std::io::BufReader::with_capacity(1 << 20, state.reader()),
            &mut hasher,
        )?;
        Ok(BackupFile {
            applied_index: machine.last_applied().unwrap_or(LogIndex(0)),
            state,
            sha256: hasher.finalize().into(),
        })
    }

    /// The log index of the last entry the state includes.
    pub fn applied_index(&self) -> LogIndex {
        self.applied_index
    }

    /// How many bytes the state has.
    pub fn state_len(&self) -> u64 {
        self.state.len()
    }

    /// The SHA-256 of the state's bytes.
    pub fn sha256(&self) -> [u8; 32] {
        self.sha256
    }

    /// The state's bytes, in pieces of at most `max` bytes.
    pub fn into_state_pieces(self, max: usize) -> impl Iterator<Item = std::io::Result<Vec<u8>>> {
        let max = max.max(1);
        let state = self.state;
        (0..state.len())
            .step_by(max)
            .map(move |start| state.read_piece(start, max))
    }

    /// How many bytes the backup file has ([`Backup::encode`]).
    fn file_len(&self) -> u64 {
        (HEADER_BYTES as u64).saturating_add(self.state.len())
    }

    /// How many bytes etcd's API streams for it ([`Backup::encode_for_etcd`]).
    pub fn etcd_len(&self) -> u64 {
        self.etcd_body_len().saturating_add(32)
    }

    /// The etcd stream's bytes before its trailing SHA-256: the file, its
    /// padding and its length, whole 512-byte pages.
    fn etcd_body_len(&self) -> u64 {
        self.file_len()
            .saturating_add(8)
            .next_multiple_of(ETCD_PAGE_BYTES as u64)
    }

    /// The bytes etcd's API streams for it ([`Backup::encode_for_etcd`]),
    /// in pieces of at most `max` bytes, the trailing SHA-256 a piece of its
    /// own (as etcd sends it), hashed as they are read.
    pub fn into_etcd_pieces(self, max: usize) -> EtcdPieces {
        let mut header = [0u8; HEADER_BYTES];
        header[..8].copy_from_slice(MAGIC);
        header[8..16].copy_from_slice(&self.applied_index.0.to_le_bytes());
        header[16..].copy_from_slice(&self.sha256);
        EtcdPieces {
            header,
            file_len: self.file_len(),
            body_len: self.etcd_body_len(),
            state: self.state,
            max: max.max(1) as u64,
            position: 0,
            hasher: Some(Sha256::new()),
        }
    }
}

/// The pieces of a [`BackupFile`] as etcd's API streams it
/// ([`BackupFile::into_etcd_pieces`]).
#[derive(Debug)]
pub struct EtcdPieces {
    header: [u8; HEADER_BYTES],
    state: SnapshotFile,
    file_len: u64,
    body_len: u64,
    max: u64,
    position: u64,
    /// Taken when the trailing SHA-256 is sent.
    hasher: Option<Sha256>,
}

impl EtcdPieces {
    /// The stream's bytes from `start` to `end` (both within the body).
    fn body(&self, start: u64, end: u64) -> std::io::Result<Vec<u8>> {
        let mut piece = Vec::with_capacity(usize::try_from(end - start).unwrap_or(0));
        let header_end = HEADER_BYTES as u64;
        let length_at = self.body_len - 8;
        let mut at = start;
        while at < end {
            if at < header_end {
                let to = end.min(header_end);
                piece.extend_from_slice(&self.header[at as usize..to as usize]);
                at = to;
            } else if at < self.file_len {
                let to = end.min(self.file_len);
                let read = self
                    .state
                    .read_piece(at - header_end, usize::try_from(to - at).unwrap_or(0))?;
                piece.extend_from_slice(&read);
                at = to;
            } else if at < length_at {
                let to = end.min(length_at);
                piece.resize(piece.len() + usize::try_from(to - at).unwrap_or(0), 0);
                at = to;
            } else {
                let length = self.file_len.to_le_bytes();
                let to = end.min(self.body_len);
                piece.extend_from_slice(
                    &length[(at - length_at) as usize..(to - length_at) as usize],
                );
                at = to;
            }
        }
        Ok(piece)
    }
}

impl Iterator for EtcdPieces {
    type Item = std::io::Result<Vec<u8>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.position < self.body_len {
            let end = self.position.saturating_add(self.max).min(self.body_len);
            let piece = self.body(self.position, end);
            match (&piece, self.hasher.as_mut()) {
                (Ok(bytes), Some(hasher)) => hasher.update(bytes),
                // A failed read ends the stream: no hash of what was not sent.
                _ => self.hasher = None,
            }
            self.position = if piece.is_ok() { end } else { self.body_len };
            return Some(piece);
        }
        self.hasher
            .take()
            .map(|hasher| Ok(hasher.finalize().to_vec()))
    }
}

/// Seeds the empty `data_dir` of node `id` of a new cluster of `members`
/// with `backup`: the identity of the node, a log that starts after the
/// backup's index, and the backup as the node's snapshot with the new
/// membership. Started with `serve --id ID --initial-cluster ...` (the same
/// members), every node resumes from the backup's state.
pub async fn restore(
    backup: &Backup,
    data_dir: &Path,
    id: NodeId,
    members: &BTreeMap<NodeId, NodeInfo>,
) -> Result<(), BackupError> {
    let mut machine = backup.check()?;
    if !members.contains_key(&id) {
        return Err(BackupError::NotAMember(id));
    }
    if std::fs::read_dir(data_dir).is_ok_and(|mut entries| entries.next().is_some()) {
        return Err(BackupError::NotEmpty(data_dir.to_path_buf()));
    }
    crate::identity::check_or_record(data_dir, id, &crate::identity::describe_cluster(members))
        .map_err(|e| BackupError::Io {
            path: data_dir.to_path_buf(),
            source: std::io::Error::other(e.to_string()),
        })?;
    // A new cluster, with an id of its own (as etcd's restore makes one):
    // every member seeds the same state, with the same id, which members
    // that join it later get in the snapshot.
    machine.record_cluster_id(crate::identity::cluster_id(members));
    let limits = backup.limits()?;
    seed(
        data_dir,
        id,
        members,
        backup.applied_index,
        limits,
        machine.snapshot(),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_file_is_checked_from_disk_and_damage_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let mut machine = StateMachine::new(Limits::default());
        machine.apply_empty(LogIndex(7));
        let backup = Backup {
            applied_index: LogIndex(7),
            state: machine.snapshot(),
        };
        let path = dir.path().join("backup");
        std::fs::write(&path, backup.encode()).unwrap();
        Backup::check_file(&path).expect("a whole backup checks");
        assert_eq!(
            Backup::decode(&std::fs::read(&path).unwrap()).unwrap(),
            backup
        );
        let mut bytes = backup.encode();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(
            Backup::check_file(&path),
            Err(BackupError::Checksum)
        ));
        let mut wrong_index = backup.clone();
        wrong_index.applied_index = LogIndex(8);
        std::fs::write(&path, wrong_index.encode()).unwrap();
        assert!(matches!(
            Backup::check_file(&path),
            Err(BackupError::IndexMismatch { named: 8, .. })
        ));
        std::fs::write(&path, b"OKV").unwrap();
        assert!(matches!(
            Backup::check_file(&path),
            Err(BackupError::BadMagic)
        ));
    }

    #[test]
    fn a_backup_file_sends_the_bytes_of_the_backup_in_pieces() {
        let dir = tempfile::tempdir().unwrap();
        let machine = StateMachine::new(Limits::default());
        let state = machine.snapshot();
        let backup = Backup {
            applied_index: LogIndex(0),
            state: state.clone(),
        };
        for max in [1, 7, 100, 1 << 20] {
            let made = BackupFile::make(&machine, dir.path()).unwrap();
            // Nothing is left in the directory: the file goes with its handle.
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
            assert_eq!(made.state_len(), state.len() as u64);
            assert_eq!(made.sha256().as_slice(), Sha256::digest(&state).as_slice());
            let pieces: Vec<Vec<u8>> = made.into_state_pieces(max).map(Result::unwrap).collect();
            assert!(pieces.iter().all(|piece| piece.len() <= max));
            assert_eq!(pieces.concat(), state);

            let made = BackupFile::make(&machine, dir.path()).unwrap();
            let length = made.etcd_len();
            let pieces: Vec<Vec<u8>> = made.into_etcd_pieces(max).map(Result::unwrap).collect();
            let expected = backup.encode_for_etcd();
            assert_eq!(length, expected.len() as u64);
            // The SHA-256 is a piece of its own, the last.
            assert_eq!(pieces.last().map(Vec::len), Some(32));
            assert!(
                pieces[..pieces.len() - 1]
                    .iter()
                    .all(|piece| piece.len() <= max)
            );
            assert_eq!(pieces.concat(), expected, "pieces of at most {max} bytes");
        }
    }

    #[test]
    fn a_file_saved_through_etcds_api_reads_as_the_backup() {
        let backup = Backup {
            applied_index: LogIndex(42),
            state: b"the state machine's bytes".to_vec(),
        };
        assert_eq!(Backup::decode(&backup.encode()).ok(), Some(backup.clone()));
        let etcd = backup.encode_for_etcd();
        assert_eq!((etcd.len() - 32) % 512, 0);
        assert_eq!(Backup::decode(&etcd).ok(), Some(backup));
        // A damaged trailer is not stripped, and the file is refused.
        let mut damaged = etcd;
        let last = damaged.len() - 1;
        damaged[last] ^= 1;
        assert!(matches!(
            Backup::decode(&damaged),
            Err(BackupError::Checksum)
        ));
    }
}
