//! The openraft state-machine store: applies committed entries to the pure
//! `oncekv_state::StateMachine`, answers each proposer with its outcome, and
//! builds, persists and installs snapshots (sessions and completion records
//! included). The newest snapshot is kept in one file, replaced atomically
//! (write, fsync, rename, fsync the directory), so a restart resumes from it
//! plus the log tail. The file holds the state-machine bytes, then the
//! snapshot's metadata, its length and a magic number, so a snapshot
//! received into a spool file becomes the snapshot file by appending the
//! metadata and renaming it, without a copy. Snapshot data is never a
//! buffer as large as the state:
//! openraft's `SnapshotData` is a [`SnapshotFile`], a handle on the bytes in
//! that file (or in the spool file a received snapshot came into), read in
//! pieces when a peer needs them.
//!
//! Building a snapshot holds the state lock only to copy the state machine,
//! whose tables share structure, so the copy takes the same short time
//! whatever the state's size; the copy is then encoded straight into the
//! file in bounded pieces (`StateMachine::write_snapshot`), off the lock and
//! off the async threads, so applies (and the writes waiting on them) go on
//! meanwhile, and the snapshot is still the state at exactly one applied
//! index. Installing one restores it from its file through a reader
//! (`StateMachine::restore_from`), or takes the state the peer service
//! already restored it to, then moves the spool file into place (or
//! copies other bytes into this store's file in bounded pieces). The state
//! it replaces is dropped after the lock is released.

use super::snapshot_file::SnapshotFile;
use super::storage_failure::StorageFailure;
use super::type_config::{Applied, TypeConfig};
use super::write_behind::WriteBehind;
use futures_util::{Stream, StreamExt};
use oncekv_state::{Limits, LogIndex, StateMachine};
use openraft::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend};
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// The Raft handle of an oncekv node: openraft over [`TypeConfig`] and
/// this store (defined here, above both, so the type configuration needs
/// no store).
pub type Raft = openraft::Raft<TypeConfig, StateMachineStore>;

const SNAPSHOT_FILE: &str = "snapshot.bin";
/// The last 8 bytes of a snapshot file: the state-machine bytes come first,
/// then the metadata, its length (u64 LE) and this.
const SNAPSHOT_MAGIC: &[u8; 8] = b"OKVRSNP2";
/// The first 8 bytes of a snapshot file written before the metadata moved
/// to the end: the magic, the metadata's length, the metadata, then the
/// state-machine bytes. Still read.
const SNAPSHOT_MAGIC_METADATA_FIRST: &[u8; 8] = b"OKVRSNP1";

/// The applied state, shared between the store (which applies) and the node
/// (which reads from it for read-index and serializable reads, and status).
#[derive(Debug)]
pub struct AppliedState {
    /// The replicated state machine.
    pub machine: StateMachine,
    /// The log id of the last applied entry.
    pub last_applied: Option<LogIdOf<TypeConfig>>,
    /// The last applied membership.
    pub membership: StoredMembershipOf<TypeConfig>,
    /// Bytes of keys and values applied since the last snapshot was built
    /// (not persisted): a snapshot is due when it passes
    /// `ConsensusOptions::snapshot_after_bytes`.
    pub bytes_since_snapshot: u64,
    /// Tells watchers of each applied change (under this lock).
    pub watch: crate::watch::WatchHub,
}

/// A handle to the applied state.
#[derive(Clone, Debug)]
pub struct SharedState(Arc<Mutex<AppliedState>>);

impl SharedState {
    /// Locks the applied state (the lock policy of [`crate::sync`]: an
    /// apply that panics ends the node process).
    pub fn lock(&self) -> MutexGuard<'_, AppliedState> {
        crate::sync::lock(&self.0)
    }
}

/// What the snapshot file holds besides the state machine bytes.
#[derive(Serialize, Deserialize)]
struct SnapshotHeader {
    meta: SnapshotMetaOf<TypeConfig>,
}

/// The state-machine store.
#[derive(Debug, Clone)]
pub struct StateMachineStore {
    state: SharedState,
    limits: Limits,
    /// Whether the machine deduplicates (see `StateMachine::without_dedup`).
    dedup: bool,
    /// Whether snapshot files are written on the calling task rather than
    /// on a blocking thread (deterministic simulation).
    inline_io: bool,
    dir: PathBuf,
    /// The snapshot in the file, if there is one.
    current: Arc<Mutex<Option<CurrentSnapshot>>>,
    /// How long a snapshot may be put off while the current one is sent
    /// to a peer; `None`: never put off.
    deferral: Option<SnapshotDeferral>,
    /// The kind of the first failed snapshot write.
    failure: StorageFailure,
}

/// The snapshot in the store's file: its metadata, and the one handle on
/// the file that all its readers share, so that the file, once replaced,
/// is released gradually when the last of them is done
/// ([`super::gradual_release`]).
#[derive(Debug)]
struct CurrentSnapshot {
    meta: SnapshotMetaOf<TypeConfig>,
    data: SnapshotFile,
}

/// A snapshot that openraft's policy asks for is put off while the
/// current one is being sent to a peer (until the peer replied), and while
/// a peer that installed it catches up from the log after it: built
/// meanwhile, it would let the log be purged past the one sent, and the
/// peer (a new member, say) would need the newer one sent too (two states
/// in its memory at once, and the whole transfer again; openraft keeps the
/// log for a peer being sent entries, not for one being sent a snapshot,
/// nor between two rounds of entries). Put off only until this many
/// entries, or bytes of keys and values, were applied since the current
/// snapshot, so a peer that never finishes (or a follower that stopped
/// after the snapshot) cannot grow the log without bound. A snapshot whose
/// building began before that is reported built only once the peers no
/// longer need the one it replaced.
#[derive(Clone, Debug)]
pub struct SnapshotDeferral {
    /// Entries applied since the current snapshot.
    pub entries: u64,
    /// Bytes of keys and values applied since the last snapshot was built.
    pub bytes: u64,
    /// Entries a snapshot leaves in the log behind it: a peer no further
    /// behind keeps what it needs.
    pub kept: u64,
    /// What the peers hold, once consensus runs (it is set after the store
    /// is handed to it).
    pub peers: Arc<OnceLock<PeerProgress>>,
}

/// The log index each peer is known to hold (its matched index; `None`:
/// nothing known), as this node sees it when it leads; none otherwise.
#[derive(Clone)]
pub struct PeerProgress(Arc<dyn Fn() -> Vec<Option<u64>> + Send + Sync>);

impl PeerProgress {
    /// Progress read by `matched`.
    pub fn new(matched: impl Fn() -> Vec<Option<u64>> + Send + Sync + 'static) -> PeerProgress {
        PeerProgress(Arc::new(matched))
    }

    fn matched(&self) -> Vec<Option<u64>> {
        (self.0)()
    }
}

impl std::fmt::Debug for PeerProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerProgress")
    }
}

/// How often a new snapshot checks whether peers still need the one it
/// replaced ([`SnapshotDeferral`]).
const PEER_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// The most bytes the snapshot file's metadata may announce (it holds the
/// membership: far less).
const SNAPSHOT_HEADER_BYTES_MAX: u64 = 64 * 1024 * 1024;

fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

impl StateMachineStore {
    /// Opens the store in `dir`, resuming from the snapshot there if any.
    pub fn open(dir: &Path, limits: Limits) -> io::Result<StateMachineStore> {
        crate::private_fs::create_dir(dir)?;
        // A snapshot whose write was cut off (a crash, a full disk) is not
        // the snapshot; give its space back.
        match std::fs::remove_file(dir.join(format!("{SNAPSHOT_FILE}.tmp"))) {
            Err(error) if error.kind() != io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
        let mut store = StateMachineStore {
            state: SharedState(Arc::new(Mutex::new(AppliedState {
                machine: StateMachine::new(limits.clone()),
                last_applied: None,
                membership: StoredMembershipOf::<TypeConfig>::default(),
                bytes_since_snapshot: 0,
                watch: crate::watch::WatchHub::default(),
            }))),
            limits,
            dedup: true,
            inline_io: false,
            dir: dir.to_path_buf(),
            current: Arc::new(Mutex::new(None)),
            deferral: None,
            failure: StorageFailure::default(),
        };
        let path = dir.join(SNAPSHOT_FILE);
        if let Some((meta, data)) = open_snapshot_file(&path)? {
            let machine = store.restore(&meta, &data)?;
            store.install_state(&meta, machine);
            store.set_current(meta, data);
        }
        Ok(store)
    }

    /// Makes `data` (state machine snapshot bytes) with `meta` the durable
    /// snapshot of the store in `dir`, after checking that it restores
    /// under `limits` to the index `meta` names: how a restored backup
    /// seeds a new node.
    pub fn seed(
        dir: &Path,
        limits: Limits,
        meta: SnapshotMetaOf<TypeConfig>,
        data: Vec<u8>,
    ) -> io::Result<()> {
        let mut store = StateMachineStore::open(dir, limits)?;
        let machine = StateMachine::restore(&store.limits, &data)
            .map_err(|e| invalid(format!("snapshot does not restore: {e}")))?;
        store.check_index(&meta, &machine)?;
        store.install_state(&meta, machine);
        store
            .persist(&meta, |file| {
                use std::io::Write;
                file.write_all(&data)?;
                Ok(data.len() as u64)
            })
            .map(drop)
    }

    /// Switches deduplication off, now and after every snapshot restore:
    /// the negative control of the fault checkers, never a deployment.
    pub fn without_dedup(mut self) -> StateMachineStore {
        self.dedup = false;
        let mut state = self.state.lock();
        state.machine =
            std::mem::replace(&mut state.machine, StateMachine::new(self.limits.clone()))
                .without_dedup();
        drop(state);
        self
    }

    /// Holds the watchers of the applied state to `bounds` (the default
    /// ones otherwise). Call before anything watches: the hub is replaced.
    pub fn with_watch_bounds(self, bounds: crate::watch::WatchBounds) -> StateMachineStore {
        self.state.lock().watch = crate::watch::WatchHub::new(bounds);
        self
    }

    /// Puts off snapshots while the current one is sent to a peer, within
    /// `deferral` ([`SnapshotDeferral`]).
    pub fn with_snapshot_deferral(mut self, deferral: SnapshotDeferral) -> StateMachineStore {
        self.deferral = Some(deferral);
        self
    }

    /// Whether a snapshot asked for now is put off: the current one is
    /// being sent (a handle on it is held besides the store's), and the
    /// deferral's bounds are not reached.
    fn snapshot_deferred(&self) -> bool {
        let current = self.current_lock();
        current
            .as_ref()
            .is_some_and(|current| self.needed_by_peers(current))
    }

    /// Whether `snapshot` is still needed as the newest one: it is being
    /// sent to a peer (until the peer replied), or a peer that installed it
    /// is catching up from the log after it (its matched index at or past
    /// the snapshot, short of what a new snapshot would leave in the log);
    /// and the deferral's bounds are not reached. `false` without a
    /// deferral.
    fn needed_by_peers(&self, snapshot: &CurrentSnapshot) -> bool {
        let Some(deferral) = &self.deferral else {
            return false;
        };
        if !self.within_deferral(snapshot.meta.last_log_id) {
            return false;
        }
        if snapshot.data.is_shared() {
            return true;
        }
        let index = snapshot.meta.last_log_id.map_or(0, |id| id.index);
        let applied = self.state.lock().last_applied.map_or(0, |id| id.index);
        let purged_to = applied.saturating_sub(deferral.kept);
        deferral.peers.get().is_some_and(|peers| {
            peers
                .matched()
                .into_iter()
                .flatten()
                .any(|matched| matched >= index && matched < purged_to)
        })
    }

    /// Whether fewer entries were applied since `snapshot` (a snapshot's
    /// last log id), and fewer bytes since the last snapshot was built,
    /// than the deferral's bounds; `false` without a deferral.
    fn within_deferral(&self, snapshot: Option<LogIdOf<TypeConfig>>) -> bool {
        let Some(deferral) = &self.deferral else {
            return false;
        };
        let state = self.state.lock();
        let applied = state.last_applied.map_or(0, |id| id.index);
        applied.saturating_sub(snapshot.map_or(0, |id| id.index)) < deferral.entries
            && state.bytes_since_snapshot < deferral.bytes
    }

    /// Writes snapshot files on the calling task instead of a blocking
    /// thread, so a simulated runtime runs every step itself.
    pub fn with_inline_io(mut self) -> StateMachineStore {
        self.inline_io = true;
        self
    }

    /// Makes `data` with `meta` the durable snapshot, off the async task
    /// unless `inline_io`: a received snapshot's spool file is moved into
    /// place (copied when it cannot be), other bytes are copied in bounded
    /// pieces.
    async fn persist_off_task(
        &self,
        meta: SnapshotMetaOf<TypeConfig>,
        data: SnapshotFile,
    ) -> io::Result<SnapshotFile> {
        let store = self.clone();
        let persist = move || {
            if let Some(path) = data.movable_from() {
                match store.move_into_place(&meta, path, data.len()) {
                    Ok(moved) => return Ok(moved),
                    // A spool on another file system, say: the bytes are
                    // copied (the metadata appended to the spool file lies
                    // past them, unread), and only a failed copy stops the
                    // node.
                    Err(error) => tracing::warn!(
                        %error,
                        "cannot move the received snapshot into place; copying it"
                    ),
                }
            }
            store.persist(&meta, |file| {
                // Copied a megabyte at a time.
                let mut reader = io::BufReader::with_capacity(1 << 20, data.reader());
                io::copy(&mut reader, file)
            })
        };
        if self.inline_io {
            return persist();
        }
        tokio::task::spawn_blocking(persist)
            .await
            .map_err(io::Error::other)?
    }

    /// The directory of the store's snapshot file.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The applied state, for reads.
    pub fn shared(&self) -> SharedState {
        self.state.clone()
    }

    fn current_lock(&self) -> MutexGuard<'_, Option<CurrentSnapshot>> {
        crate::sync::lock(&self.current)
    }

    /// Makes `data` with `meta` the snapshot that peers are sent. The
    /// replaced one's handle is dropped outside the lock (its last reader
    /// releases the file).
    fn set_current(&self, meta: SnapshotMetaOf<TypeConfig>, data: SnapshotFile) {
        let replaced = self.current_lock().replace(CurrentSnapshot { meta, data });
        drop(replaced);
    }

    /// The state `data` restores to (under this store's limits, to the
    /// index `meta` names), read from its file in bounded pieces.
    fn restore(
        &self,
        meta: &SnapshotMetaOf<TypeConfig>,
        data: &SnapshotFile,
    ) -> io::Result<StateMachine> {
        let machine = StateMachine::restore_from(&self.limits, data.reader())
            .map_err(|e| invalid(format!("snapshot does not restore: {e}")))?;
        self.check_index(meta, &machine)?;
        Ok(machine)
    }

    fn check_index(
        &self,
        meta: &SnapshotMetaOf<TypeConfig>,
        machine: &StateMachine,
    ) -> io::Result<()> {
        let expected = meta.last_log_id.as_ref().map(|id| LogIndex(id.index));
        if machine.last_applied() != expected {
            return Err(invalid(
                "snapshot state and metadata disagree on the last index",
            ));
        }
        Ok(())
    }

    /// Replaces the applied state with `machine`, restored from the
    /// snapshot `meta` describes. The state replaced is dropped after the
    /// lock is released (dropping a large state takes time).
    fn install_state(&mut self, meta: &SnapshotMetaOf<TypeConfig>, mut machine: StateMachine) {
        if !self.dedup {
            machine = machine.without_dedup();
        }
        let mut state = self.state.lock();
        let replaced = std::mem::replace(&mut state.machine, machine);
        state.last_applied = meta.last_log_id;
        state.membership = meta.last_membership.clone();
        let revision = meta.last_log_id.as_ref().map_or(0, |id| id.index);
        state.watch.reset(revision);
        drop(state);
        drop(replaced);
    }

    /// Writes the snapshot file durably and atomically: `meta`, then the
    /// state-machine bytes `write_state` writes (saying how many); a
    /// failure is recorded for the node's exit. Gives the bytes back as a
    /// handle on the file.
    fn persist(
        &self,
        meta: &SnapshotMetaOf<TypeConfig>,
        write_state: impl FnOnce(&mut WriteBehind<'_>) -> io::Result<u64>,
    ) -> io::Result<SnapshotFile> {
        let written = self.write_snapshot_file(meta, write_state);
        if let Err(error) = &written {
            self.failure.record(error);
        }
        written
    }

    /// Why the store stopped accepting writes, once it has.
    pub fn failure(&self) -> StorageFailure {
        self.failure.clone()
    }

    fn write_snapshot_file(
        &self,
        meta: &SnapshotMetaOf<TypeConfig>,
        write_state: impl FnOnce(&mut WriteBehind<'_>) -> io::Result<u64>,
    ) -> io::Result<SnapshotFile> {
        let tmp = self.dir.join(format!("{SNAPSHOT_FILE}.tmp"));
        let mut file = crate::private_fs::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        // Synced as it goes, so the log's syncs never wait behind a
        // snapshot's worth of dirty pages.
        let len = write_state(&mut WriteBehind::new(&mut file))?;
        self.finish_snapshot_file(meta, &mut file, &tmp)?;
        Ok(SnapshotFile::new(file, 0, len))
    }

    /// Makes the file at `path`, whose every byte is a snapshot's
    /// state-machine bytes (`len` of them: a received snapshot's spool
    /// file, in the same file system), this store's snapshot file with
    /// `meta`: the metadata appended, then moved into place. No byte of the
    /// state is copied.
    fn move_into_place(
        &self,
        meta: &SnapshotMetaOf<TypeConfig>,
        path: &Path,
        len: u64,
    ) -> io::Result<SnapshotFile> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .open(path)?;
        self.finish_snapshot_file(meta, &mut file, path)?;
        Ok(SnapshotFile::new(file, 0, len))
    }

    /// Appends `meta` to `file` (at `path`, holding the state-machine
    /// bytes), syncs it, and renames it to the snapshot file, durably.
    fn finish_snapshot_file(
        &self,
        meta: &SnapshotMetaOf<TypeConfig>,
        file: &mut std::fs::File,
        path: &Path,
    ) -> io::Result<()> {
        use std::io::Write;
        let header = postcard::to_allocvec(&SnapshotHeader { meta: meta.clone() })
            .map_err(|e| invalid(format!("snapshot metadata does not encode: {e}")))?;
        let mut trailer = header;
        trailer.extend_from_slice(&(trailer.len() as u64).to_le_bytes());
        trailer.extend_from_slice(SNAPSHOT_MAGIC);
        file.write_all(&trailer)?;
        file.sync_all()?;
        std::fs::rename(path, self.dir.join(SNAPSHOT_FILE))?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        Ok(())
    }
}

/// Opens the snapshot file at `path` and reads its metadata; the
/// state-machine bytes stay in the file. `None` if there is none.
fn open_snapshot_file(
    path: &Path,
) -> io::Result<Option<(SnapshotMetaOf<TypeConfig>, SnapshotFile)>> {
    // Open to write too: replaced, it is released gradually.
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(file) => read_snapshot_header(file)
            .map(Some)
            .map_err(|e| invalid(format!("{}: {e}", path.display()))),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// Reads a snapshot file's magic and metadata; the rest of the file is
/// the state-machine bytes.
fn read_snapshot_header(
    file: std::fs::File,
) -> Result<(SnapshotMetaOf<TypeConfig>, SnapshotFile), String> {
    use std::os::unix::fs::FileExt as _;
    let size = file.metadata().map_err(|e| e.to_string())?.len();
    if size < 16 {
        return Err("not a snapshot file (bad magic)".into());
    }
    let read = |at: u64, length: u64| -> Result<Vec<u8>, String> {
        let mut bytes = vec![0; usize::try_from(length).map_err(|e| e.to_string())?];
        file.read_exact_at(&mut bytes, at)
            .map_err(|e| e.to_string())?;
        Ok(bytes)
    };
    let length_of = |bytes: &[u8]| {
        let mut length = [0u8; 8];
        length.copy_from_slice(bytes);
        u64::from_le_bytes(length)
    };
    let end = read(size - 16, 16)?;
    let start = read(0, 16)?;
    // The metadata's place, and the state-machine bytes' (offset, length).
    let (header_at, length, state) = if &end[8..] == SNAPSHOT_MAGIC {
        let length = length_of(&end[..8]);
        let header_at = (size - 16)
            .checked_sub(length)
            .filter(|_| length <= SNAPSHOT_HEADER_BYTES_MAX)
            .ok_or("snapshot metadata truncated")?;
        (header_at, length, (0, header_at))
    } else if &start[..8] == SNAPSHOT_MAGIC_METADATA_FIRST {
        let length = length_of(&start[8..]);
        let state_at = 16u64
            .checked_add(length)
            .filter(|end| *end <= size && length <= SNAPSHOT_HEADER_BYTES_MAX)
            .ok_or("snapshot metadata truncated")?;
        (16, length, (state_at, size - state_at))
    } else {
        return Err("not a snapshot file (bad magic)".into());
    };
    let header: SnapshotHeader = postcard::from_bytes(&read(header_at, length)?)
        .map_err(|e| format!("snapshot metadata: {e}"))?;
    Ok((header.meta, SnapshotFile::new(file, state.0, state.1)))
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotFile;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<TypeConfig, SnapshotFile>, io::Error> {
        let building = std::time::Instant::now();
        let built = self.build_snapshot_now().await;
        metrics::histogram!("oncekv_snapshot_duration_seconds")
            .record(building.elapsed().as_secs_f64());
        built
    }
}

impl StateMachineStore {
    /// Copies the state under the lock (its metadata and the machine, at
    /// the same applied index), then encodes the copy straight into the
    /// snapshot file without the lock: applies wait for the copy only,
    /// not for the encoding or the disk.
    async fn build_snapshot_now(
        &mut self,
    ) -> Result<SnapshotOf<TypeConfig, SnapshotFile>, io::Error> {
        let (meta, copy) = {
            let mut state = self.state.lock();
            let copying = std::time::Instant::now();
            state.bytes_since_snapshot = 0;
            let meta = SnapshotMetaOf::<TypeConfig> {
                last_log_id: state.last_applied,
                last_membership: state.membership.clone(),
            };
            let copy = state.machine.clone();
            // Applies wait this long: the tables share structure, so the
            // copy is a handful of pointers whatever their size.
            metrics::histogram!("oncekv_snapshot_copy_duration_seconds")
                .record(copying.elapsed().as_secs_f64());
            (meta, copy)
        };
        let store = self.clone();
        let written_meta = meta.clone();
        let encode_and_persist = move || {
            let data = store.persist(&written_meta, |file| copy.write_snapshot(file));
            drop(copy);
            data
        };
        let data = if self.inline_io {
            encode_and_persist()?
        } else {
            tokio::task::spawn_blocking(encode_and_persist)
                .await
                .map_err(io::Error::other)??
        };
        let replaced = self.current_lock().replace(CurrentSnapshot {
            meta: meta.clone(),
            data: data.share(),
        });
        // A snapshot whose building began before the one it replaces was
        // sent is reported (which lets openraft purge the log up to it)
        // only once the peers no longer need the one it replaces.
        if let Some(replaced) = replaced
            && !self.inline_io
        {
            while self.needed_by_peers(&replaced) {
                tokio::time::sleep(PEER_CHECK_INTERVAL).await;
            }
        }
        Ok(SnapshotOf::<TypeConfig, SnapshotFile> {
            meta,
            snapshot: data,
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = SnapshotFile;
    type SnapshotBuilder = StateMachineStore;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogIdOf<TypeConfig>>, StoredMembershipOf<TypeConfig>), io::Error> {
        let state = self.state.lock();
        Ok((state.last_applied, state.membership.clone()))
    }

    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), io::Error>
    where
        Strm: Stream<Item = Result<openraft::storage::EntryResponder<TypeConfig>, io::Error>>
            + Unpin
            + OptionalSend,
    {
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            let index = LogIndex(entry.log_id.index);
            let applying = std::time::Instant::now();
            let applied = {
                let mut state = self.state.lock();
                let outcome = match entry.payload {
                    EntryPayload::Normal(proposal) => {
                        let bytes = proposal.request.command.payload_bytes();
                        state.bytes_since_snapshot =
                            state.bytes_since_snapshot.saturating_add(bytes);
                        let outcome = state.machine.apply_proposal(index, &proposal);
                        let command = &proposal.request.command;
                        if matches!(command, oncekv_state::Command::Auth(_)) {
                            // Watchers check their right to read again.
                            state.watch.auth_changed();
                        }
                        state.watch.applied(&state.machine, index.0);
                        Some(outcome)
                    }
                    EntryPayload::Membership(membership) => {
                        state.machine.apply_empty(index);
                        if index.0 == 0 {
                            // The founding membership, which every
                            // founding member writes alike: the cluster's
                            // id, recorded by every replica here.
                            let members: std::collections::BTreeMap<_, _> = membership
                                .nodes()
                                .map(|(id, info)| (*id, info.clone()))
                                .collect();
                            let id = crate::identity::cluster_id(&members);
                            state.machine.record_cluster_id(id);
                        }
                        state.membership =
                            StoredMembershipOf::<TypeConfig>::new(Some(entry.log_id), membership);
                        None
                    }
                    EntryPayload::Blank => {
                        state.machine.apply_empty(index);
                        None
                    }
                };
                state.last_applied = Some(entry.log_id);
                Applied { index, outcome }
            };
            metrics::histogram!("oncekv_apply_duration_seconds")
                .record(applying.elapsed().as_secs_f64());
            if let Some(responder) = responder {
                responder.send(applied);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn try_create_snapshot_builder(&mut self, force: bool) -> Option<Self::SnapshotBuilder> {
        if !force && self.snapshot_deferred() {
            tracing::info!(
                "snapshot put off: the current one is being sent to a peer, or one catches up after it"
            );
            return None;
        }
        Some(self.clone())
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TypeConfig>,
        mut snapshot: Self::SnapshotData,
    ) -> Result<(), io::Error> {
        let machine = match snapshot.take_restored() {
            // Restored by the peer service, to check it.
            Some(machine) => {
                self.check_index(meta, &machine)?;
                machine
            }
            None if self.inline_io => self.restore(meta, &snapshot)?,
            None => {
                let store = self.clone();
                let (claimed, data) = (meta.clone(), snapshot);
                let (restored, data) =
                    tokio::task::spawn_blocking(move || (store.restore(&claimed, &data), data))
                        .await
                        .map_err(io::Error::other)?;
                snapshot = data;
                restored?
            }
        };
        self.install_state(meta, machine);
        // The bytes become this store's file, the current snapshot, read
        // back when a peer needs it.
        let data = self.persist_off_task(meta.clone(), snapshot).await?;
        self.set_current(meta.clone(), data);
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TypeConfig, SnapshotFile>>, io::Error> {
        // The handle the store holds: no file is opened, and a snapshot
        // replaced while it is sent keeps its bytes until the send is done.
        Ok(self
            .current_lock()
            .as_ref()
            .map(|current| SnapshotOf::<TypeConfig, SnapshotFile> {
                meta: current.meta.clone(),
                snapshot: current.data.share(),
            }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::vote::RaftLeaderIdExt as _;
    use std::io::Write as _;

    fn meta_at(index: u64) -> SnapshotMetaOf<TypeConfig> {
        SnapshotMetaOf::<TypeConfig> {
            last_log_id: Some(LogIdOf::<TypeConfig>::new(
                <TypeConfig as openraft::RaftTypeConfig>::LeaderId::new_committed(1, 1),
                index,
            )),
            last_membership: StoredMembershipOf::<TypeConfig>::default(),
        }
    }

    fn machine_at(index: u64) -> StateMachine {
        let mut machine = StateMachine::new(Limits::default());
        machine.apply_empty(LogIndex(index));
        machine
    }

    #[test]
    fn a_snapshot_file_with_its_metadata_first_still_opens() {
        let dir = tempfile::tempdir().unwrap();
        let header = postcard::to_allocvec(&SnapshotHeader { meta: meta_at(7) }).unwrap();
        let mut file = std::fs::File::create(dir.path().join(SNAPSHOT_FILE)).unwrap();
        file.write_all(SNAPSHOT_MAGIC_METADATA_FIRST).unwrap();
        file.write_all(&(header.len() as u64).to_le_bytes())
            .unwrap();
        file.write_all(&header).unwrap();
        file.write_all(&machine_at(7).snapshot()).unwrap();
        drop(file);
        let store = StateMachineStore::open(dir.path(), Limits::default()).unwrap();
        assert_eq!(
            store.shared().lock().machine.last_applied(),
            Some(LogIndex(7))
        );
    }

    /// A store whose current snapshot is at index 10, putting off
    /// snapshots within 100 entries and 1,000 bytes, with 5 entries kept
    /// behind one; and the peers' matched indexes it reads.
    fn deferring_store(dir: &Path) -> (StateMachineStore, Arc<Mutex<Vec<Option<u64>>>>) {
        let store = StateMachineStore::open(dir, Limits::default()).unwrap();
        let data = store
            .persist(&meta_at(10), |file| machine_at(10).write_snapshot(file))
            .unwrap();
        store.set_current(meta_at(10), data);
        let peers = Arc::new(OnceLock::new());
        let store = store.with_snapshot_deferral(SnapshotDeferral {
            entries: 100,
            bytes: 1_000,
            kept: 5,
            peers: Arc::clone(&peers),
        });
        let matched = Arc::new(Mutex::new(Vec::new()));
        let reported = Arc::clone(&matched);
        peers
            .set(PeerProgress::new(move || reported.lock().unwrap().clone()))
            .unwrap();
        (store, matched)
    }

    #[test]
    fn a_snapshot_is_put_off_while_the_current_one_is_sent_within_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, matched) = deferring_store(dir.path());
        store.shared().lock().last_applied = meta_at(50).last_log_id;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let builds = |store: &mut StateMachineStore, force: bool| {
            runtime
                .block_on(store.try_create_snapshot_builder(force))
                .is_some()
        };
        // Nothing is being sent: built.
        assert!(builds(&mut store, false));
        // A peer is being sent the current snapshot: put off, unless forced.
        let sent = runtime.block_on(store.get_current_snapshot()).unwrap();
        assert!(sent.is_some());
        assert!(!builds(&mut store, false));
        assert!(builds(&mut store, true));
        // Put off no further than the bounds: entries since it...
        store.shared().lock().last_applied = meta_at(110).last_log_id;
        assert!(builds(&mut store, false));
        store.shared().lock().last_applied = meta_at(50).last_log_id;
        assert!(!builds(&mut store, false));
        // ...or bytes applied.
        store.shared().lock().bytes_since_snapshot = 1_000;
        assert!(builds(&mut store, false));
        store.shared().lock().bytes_since_snapshot = 0;
        // The send is over: built, unless a peer that installed the
        // snapshot (at index 10) is catching up from the log after it
        // (applied 50, 5 entries kept behind a new snapshot).
        drop(sent);
        assert!(builds(&mut store, false));
        *matched.lock().unwrap() = vec![Some(50), Some(20)];
        assert!(!builds(&mut store, false));
        assert!(builds(&mut store, true));
        // Caught up to what a new snapshot keeps: built.
        *matched.lock().unwrap() = vec![Some(50), Some(45)];
        assert!(builds(&mut store, false));
        // Behind the snapshot (it needs a snapshot anyway), or unknown:
        // built.
        *matched.lock().unwrap() = vec![Some(9), None];
        assert!(builds(&mut store, false));
        // Put off no further than the bounds.
        *matched.lock().unwrap() = vec![Some(20)];
        store.shared().lock().last_applied = meta_at(110).last_log_id;
        assert!(builds(&mut store, false));
        // A store without a deferral never puts one off.
        let mut plain = StateMachineStore::open(dir.path(), Limits::default()).unwrap();
        let _sent = runtime.block_on(plain.get_current_snapshot()).unwrap();
        assert!(builds(&mut plain, false));
    }

    #[test]
    fn a_snapshot_built_while_peers_need_the_one_before_is_reported_once_they_do_not() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, matched) = deferring_store(dir.path());
        store.shared().lock().last_applied = meta_at(20).last_log_id;
        let current_index = |store: &StateMachineStore| {
            store
                .current_lock()
                .as_ref()
                .and_then(|c| c.meta.last_log_id)
                .map(|id| id.index)
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let sent = store.get_current_snapshot().await.unwrap();
            let mut builder = store.clone();
            let built = tokio::spawn(async move { builder.build_snapshot().await });
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while current_index(&store) != Some(20) {
                assert!(std::time::Instant::now() < deadline, "never written");
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            // Written and current; not reported while the one before is
            // sent, nor while the peer that installed it catches up (index
            // 10 of 20, 5 entries kept behind a new snapshot).
            let pause = std::time::Duration::from_millis(300);
            tokio::time::sleep(pause).await;
            assert!(!built.is_finished(), "reported while the send went on");
            drop(sent);
            *matched.lock().unwrap() = vec![Some(10)];
            tokio::time::sleep(pause).await;
            assert!(!built.is_finished(), "reported while the peer caught up");
            *matched.lock().unwrap() = vec![Some(18)];
            tokio::time::timeout(std::time::Duration::from_secs(60), built)
                .await
                .expect("reported once the peer caught up")
                .unwrap()
                .unwrap();
        });
    }

    #[test]
    fn a_moved_snapshot_file_and_a_written_one_open_alike() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateMachineStore::open(dir.path(), Limits::default()).unwrap();
        store
            .persist(&meta_at(3), |file| machine_at(3).write_snapshot(file))
            .unwrap();
        drop(store);
        let store = StateMachineStore::open(dir.path(), Limits::default()).unwrap();
        assert_eq!(
            store.shared().lock().machine.last_applied(),
            Some(LogIndex(3))
        );

        let spool = dir.path().join("received.part");
        let bytes = machine_at(9).snapshot();
        std::fs::write(&spool, &bytes).unwrap();
        let moved = store
            .move_into_place(&meta_at(9), &spool, bytes.len() as u64)
            .unwrap();
        assert!(!spool.exists(), "moved, not copied");
        let mut read = Vec::new();
        io::Read::read_to_end(&mut moved.reader(), &mut read).unwrap();
        assert_eq!(
            read, bytes,
            "the moved file's handle reads the state's bytes"
        );
        drop(store);
        let store = StateMachineStore::open(dir.path(), Limits::default()).unwrap();
        assert_eq!(
            store.shared().lock().machine.last_applied(),
            Some(LogIndex(9))
        );

        // A spool file that cannot be moved (gone from its directory here;
        // on another file system in practice) is copied instead.
        let spool = dir.path().join("received-2.part");
        std::fs::write(&spool, machine_at(11).snapshot()).unwrap();
        let data = SnapshotFile::movable(&spool).unwrap();
        std::fs::remove_file(&spool).unwrap();
        let store = store.with_inline_io();
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(store.persist_off_task(meta_at(11), data))
            .unwrap();
        drop(store);
        let store = StateMachineStore::open(dir.path(), Limits::default()).unwrap();
        assert_eq!(
            store.shared().lock().machine.last_applied(),
            Some(LogIndex(11))
        );

        // Neither magic: refused, not misread.
        std::fs::write(dir.path().join(SNAPSHOT_FILE), vec![0u8; 64]).unwrap();
        assert!(StateMachineStore::open(dir.path(), Limits::default()).is_err());
    }
}
