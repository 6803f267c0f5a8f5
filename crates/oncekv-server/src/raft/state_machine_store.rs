//! The openraft state-machine store: applies committed entries to the pure
//! `oncekv_state::StateMachine`, answers each proposer with its outcome, and
//! builds, persists and installs snapshots (sessions and completion records
//! included). The newest snapshot is kept in one file, replaced atomically
//! (write, fsync, rename, fsync the directory), so a restart resumes from it
//! plus the log tail; it is read back from that file when a peer needs it,
//! so its bytes are not held in memory beside the state.
//!
//! Building a snapshot holds the state lock only to copy the state machine,
//! whose tables share structure, so the copy takes the same short time
//! whatever the state's size; encoding and writing the copy happen off the
//! lock and off the async threads, so applies (and the writes waiting on
//! them) go on meanwhile, and the snapshot is still the state at exactly
//! one applied index.

use super::storage_failure::StorageFailure;
use super::type_config::{Applied, TypeConfig};
use futures_util::{Stream, StreamExt};
use oncekv_state::{Entry, Limits, LogIndex, StateMachine};
use openraft::alias::{LogIdOf, SnapshotMetaOf, SnapshotOf, StoredMembershipOf};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend};
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

/// The Raft handle of an oncekv node: openraft over [`TypeConfig`] and
/// this store (defined here, above both, so the type configuration needs
/// no store).
pub type Raft = openraft::Raft<TypeConfig, StateMachineStore>;

const SNAPSHOT_FILE: &str = "snapshot.bin";
const SNAPSHOT_MAGIC: &[u8; 8] = b"OKVRSNP1";

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
    /// The metadata of the snapshot in the file, if there is one.
    current: Arc<Mutex<Option<SnapshotMetaOf<TypeConfig>>>>,
    /// The kind of the first failed snapshot write.
    failure: StorageFailure,
}

#[derive(Debug, Clone)]
struct StoredSnapshot {
    meta: SnapshotMetaOf<TypeConfig>,
    data: Vec<u8>,
}

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
            failure: StorageFailure::default(),
        };
        let path = dir.join(SNAPSHOT_FILE);
        if let Some(snapshot) = read_snapshot_file(&path)? {
            store.load(&snapshot)?;
            *store.current_lock() = Some(snapshot.meta);
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
        let snapshot = StoredSnapshot { meta, data };
        store.load(&snapshot)?;
        store.persist(&snapshot)
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

    /// Writes snapshot files on the calling task instead of a blocking
    /// thread, so a simulated runtime runs every step itself.
    pub fn with_inline_io(mut self) -> StateMachineStore {
        self.inline_io = true;
        self
    }

    /// Makes `snapshot` the durable one, off the async task unless
    /// `inline_io`.
    async fn persist_off_task(&self, snapshot: StoredSnapshot) -> io::Result<()> {
        if self.inline_io {
            return self.persist(&snapshot);
        }
        let store = self.clone();
        tokio::task::spawn_blocking(move || store.persist(&snapshot))
            .await
            .map_err(io::Error::other)?
    }

    /// The applied state, for reads.
    pub fn shared(&self) -> SharedState {
        self.state.clone()
    }

    fn current_lock(&self) -> MutexGuard<'_, Option<SnapshotMetaOf<TypeConfig>>> {
        crate::sync::lock(&self.current)
    }

    /// Replaces the applied state with a snapshot's.
    fn load(&mut self, snapshot: &StoredSnapshot) -> io::Result<()> {
        let mut machine = StateMachine::restore(&self.limits, &snapshot.data)
            .map_err(|e| invalid(format!("snapshot does not restore: {e}")))?;
        if !self.dedup {
            machine = machine.without_dedup();
        }
        let expected = snapshot
            .meta
            .last_log_id
            .as_ref()
            .map(|id| LogIndex(id.index));
        if machine.last_applied() != expected {
            return Err(invalid(
                "snapshot state and metadata disagree on the last index",
            ));
        }
        let mut state = self.state.lock();
        state.machine = machine;
        state.last_applied = snapshot.meta.last_log_id;
        state.membership = snapshot.meta.last_membership.clone();
        let revision = expected.map_or(0, |index| index.0);
        state.watch.reset(revision);
        Ok(())
    }

    /// Writes the snapshot file durably and atomically.
    /// Writes the snapshot file; a failure is recorded for the node's exit.
    fn persist(&self, snapshot: &StoredSnapshot) -> io::Result<()> {
        let written = self.write_snapshot_file(snapshot);
        if let Err(error) = &written {
            self.failure.record(error);
        }
        written
    }

    /// Why the store stopped accepting writes, once it has.
    pub fn failure(&self) -> StorageFailure {
        self.failure.clone()
    }

    fn write_snapshot_file(&self, snapshot: &StoredSnapshot) -> io::Result<()> {
        let header = postcard::to_allocvec(&SnapshotHeader {
            meta: snapshot.meta.clone(),
        })
        .map_err(|e| invalid(format!("snapshot metadata does not encode: {e}")))?;
        let tmp = self.dir.join(format!("{SNAPSHOT_FILE}.tmp"));
        {
            use std::io::Write;
            // Written piece by piece: the data is not copied again.
            let mut file = crate::private_fs::create(&tmp)?;
            file.write_all(SNAPSHOT_MAGIC)?;
            file.write_all(&(header.len() as u64).to_le_bytes())?;
            file.write_all(&header)?;
            file.write_all(&snapshot.data)?;
            file.sync_all()?;
        }
        std::fs::rename(&tmp, self.dir.join(SNAPSHOT_FILE))?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        Ok(())
    }
}

/// Reads and decodes the snapshot file at `path`; `None` if there is none.
fn read_snapshot_file(path: &Path) -> io::Result<Option<StoredSnapshot>> {
    match std::fs::read(path) {
        Ok(bytes) => decode_snapshot_file(bytes)
            .map(Some)
            .map_err(|e| invalid(format!("{}: {e}", path.display()))),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// Splits a snapshot file into its metadata and the state machine bytes,
/// reusing the file's buffer for the latter (no second copy of the state).
fn decode_snapshot_file(bytes: Vec<u8>) -> Result<StoredSnapshot, String> {
    if bytes.len() < 16 || &bytes[..8] != SNAPSHOT_MAGIC {
        return Err("not a snapshot file (bad magic)".into());
    }
    let mut length = [0u8; 8];
    length.copy_from_slice(&bytes[8..16]);
    let length = usize::try_from(u64::from_le_bytes(length)).map_err(|e| e.to_string())?;
    let end = 16usize
        .checked_add(length)
        .filter(|end| *end <= bytes.len());
    let end = end.ok_or("snapshot header truncated")?;
    let header: SnapshotHeader =
        postcard::from_bytes(&bytes[16..end]).map_err(|e| format!("snapshot header: {e}"))?;
    let mut data = bytes;
    data.drain(..end);
    Ok(StoredSnapshot {
        meta: header.meta,
        data,
    })
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    type SnapshotData = Vec<u8>;

    async fn build_snapshot(&mut self) -> Result<SnapshotOf<TypeConfig, Vec<u8>>, io::Error> {
        let building = std::time::Instant::now();
        let built = self.build_snapshot_now().await;
        metrics::histogram!("oncekv_snapshot_duration_seconds")
            .record(building.elapsed().as_secs_f64());
        built
    }
}

impl StateMachineStore {
    /// Copies the state under the lock (its metadata and the machine, at
    /// the same applied index), then encodes and writes the copy without
    /// the lock: applies wait for the copy only, not for the encoding or
    /// the disk.
    async fn build_snapshot_now(&mut self) -> Result<SnapshotOf<TypeConfig, Vec<u8>>, io::Error> {
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
        let encode_and_persist = move || {
            let snapshot = StoredSnapshot {
                meta,
                data: copy.snapshot(),
            };
            drop(copy);
            store.persist(&snapshot).map(|()| snapshot)
        };
        let snapshot = if self.inline_io {
            encode_and_persist()?
        } else {
            tokio::task::spawn_blocking(encode_and_persist)
                .await
                .map_err(io::Error::other)??
        };
        *self.current_lock() = Some(snapshot.meta.clone());
        Ok(SnapshotOf::<TypeConfig, Vec<u8>> {
            meta: snapshot.meta,
            snapshot: snapshot.data,
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotData = Vec<u8>;
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
                        let applied = Entry { index, proposal };
                        let outcome = state.machine.apply(&applied);
                        let command = &applied.proposal.request.command;
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

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaOf<TypeConfig>,
        snapshot: Self::SnapshotData,
    ) -> Result<(), io::Error> {
        let stored = StoredSnapshot {
            meta: meta.clone(),
            data: snapshot,
        };
        self.load(&stored)?;
        // The data is persisted, then dropped: the file is the current
        // snapshot, read back when a peer needs it.
        self.persist_off_task(stored).await?;
        *self.current_lock() = Some(meta.clone());
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<SnapshotOf<TypeConfig, Vec<u8>>>, io::Error> {
        if self.current_lock().is_none() {
            return Ok(None);
        }
        // The file holds the newest persisted snapshot (replaced atomically,
        // never older than the metadata kept), with its own metadata.
        let path = self.dir.join(SNAPSHOT_FILE);
        let read = if self.inline_io {
            read_snapshot_file(&path)?
        } else {
            tokio::task::spawn_blocking(move || read_snapshot_file(&path))
                .await
                .map_err(io::Error::other)??
        };
        let stored = read.ok_or_else(|| invalid("the snapshot file is missing"))?;
        Ok(Some(SnapshotOf::<TypeConfig, Vec<u8>> {
            meta: stored.meta,
            snapshot: stored.data,
        }))
    }
}
