//! Seeding a new node's consensus storage from a state taken elsewhere (a
//! backup's restore): the state as the node's snapshot at a given index,
//! with a fresh membership, and a log that starts after it. What openraft
//! needs for that (its log ids, membership and vote types) stays here.

use super::segment_log::SegmentLog;
use super::state_machine_store::StateMachineStore;
use super::type_config::{NodeId, NodeInfo, TypeConfig};
use oncekv_state::{Limits, LogIndex};
use openraft::Membership;
use openraft::alias::{LogIdOf, SnapshotMetaOf, StoredMembershipOf, VoteOf};
use openraft::storage::RaftLogStorage;
use openraft::vote::RaftLeaderIdExt as _;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Why the storage could not be seeded.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    /// A directory could not be written.
    #[error("writing {path}: {source}")]
    Io {
        /// What was being written.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The members do not form a membership.
    #[error("the initial cluster is not a valid membership: {0}")]
    Membership(String),
    /// The members are empty.
    #[error("the initial cluster has no members")]
    NoMembers,
}

/// Seeds `data_dir`'s state and log directories for member `id` of
/// `members`: `snapshot` (the state machine's snapshot bytes, with
/// `limits`) as the node's snapshot at `applied`, every member a voter.
/// Every member seeds the same entry id (term 1, led by the lowest id), so
/// the members agree on it, and votes for itself in term 1.
pub async fn seed(
    data_dir: &Path,
    id: NodeId,
    members: &BTreeMap<NodeId, NodeInfo>,
    applied: LogIndex,
    limits: Limits,
    snapshot: Vec<u8>,
) -> Result<(), SeedError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| SeedError::Io { path, source }
    };
    let first = *members.keys().next().ok_or(SeedError::NoMembers)?;
    let leader = <TypeConfig as openraft::RaftTypeConfig>::LeaderId::new_committed(1, first);
    let log_id = LogIdOf::<TypeConfig>::new(leader, applied.0);
    let voters: BTreeSet<NodeId> = members.keys().copied().collect();
    let membership = Membership::new(vec![voters], members.clone())
        .map_err(|e| SeedError::Membership(e.to_string()))?;
    let meta = SnapshotMetaOf::<TypeConfig> {
        last_log_id: Some(log_id),
        last_membership: StoredMembershipOf::<TypeConfig>::new(Some(log_id), membership),
    };
    let state_dir = data_dir.join("state");
    StateMachineStore::seed(&state_dir, limits, meta, snapshot).map_err(io(&state_dir))?;
    let log_dir = data_dir.join("log");
    let mut log = SegmentLog::open(&log_dir).map_err(io(&log_dir))?;
    log.save_vote(&VoteOf::<TypeConfig>::new(1, id))
        .await
        .map_err(io(&log_dir))?;
    log.purge(log_id).await.map_err(io(&log_dir))?;
    Ok(())
}
