//! `etcdserverpb.Maintenance` onto the node: Status from the node's
//! consensus progress and store counters (what `etcdctl endpoint status`
//! shows); Alarm (the store's `NOSPACE` alarm, which is the cluster's:
//! listed for every member, disarmed through the log); Defragment, which
//! has nothing to do (the store is in memory, the log compacts itself)
//! and succeeds; Snapshot, a backup taken on the leader (as `oncekv
//! snapshot save` takes it) streamed in chunks and ended by the SHA-256 of
//! all of it, as etcd ends its own (`oncekv snapshot restore` reads the
//! file `etcdctl snapshot save` writes); Hash, this member's state digest
//! (the whole state machine: keys, leases, sessions, users) folded to 32
//! bits; HashKV, a CRC-32 of the keys as they were at a revision (each
//! key with its value, lease and revisions, in key order), which members
//! at that revision answer alike; MoveLeader, a leadership transfer
//! through openraft, on the leader only (etcd's rule). Like the native
//! status and alarms, they need the admin role while authentication is
//! enforced.

use super::errors::{EtcdError, error_of};
use super::forward::{Route, answered};
use super::{EtcdApi, credentials_of};
use crate::raft::consensus::WriteError;
use oncekv_proto::etcd::etcdserverpb::alarm_request::AlarmAction;
use oncekv_proto::etcd::etcdserverpb::maintenance_client::MaintenanceClient;
use oncekv_proto::etcd::etcdserverpb::maintenance_server::Maintenance;
use oncekv_proto::etcd::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, AlarmType, DefragmentRequest, DefragmentResponse,
    HashKvRequest, HashKvResponse, HashRequest, HashResponse, MoveLeaderRequest,
    MoveLeaderResponse, SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};
use oncekv_state::{Command, StateMachine, StoredValue};
use std::collections::BTreeMap;
use tonic::codegen::BoxStream;
use tonic::{Response, Status};

/// Bytes per chunk of a streamed snapshot.
const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;

/// The etcd version the node reports by default: the release whose API
/// (as far as it reaches) the node serves. Clients gate features on it
/// (Kubernetes sends watch progress requests only to 3.5.13 and later);
/// `serve --etcd-version` changes it.
pub const ETCD_VERSION: &str = "3.4.0";

impl EtcdApi {
    /// The cluster's alarms, by member: the store quota's `NOSPACE` (the
    /// quota is the cluster's, so every member's), and those raised by
    /// hand.
    fn alarms(&self) -> Vec<AlarmMember> {
        let (quota, by_hand) = self.node.consensus().with_state(|state| {
            (
                state.stats().no_space_alarm,
                state.alarmed_members().clone(),
            )
        });
        let mut members: std::collections::BTreeSet<u64> = by_hand;
        if quota {
            members.extend(self.node.status().raft.members.iter().map(|m| m.id));
        }
        members
            .into_iter()
            .map(|member_id| AlarmMember {
                member_id,
                alarm: AlarmType::Nospace as i32,
            })
            .collect()
    }
}

#[tonic::async_trait]
impl Maintenance for EtcdApi {
    async fn status(
        &self,
        request: tonic::Request<StatusRequest>,
    ) -> Result<Response<StatusResponse>, Status> {
        self.node
            .require_admin(&credentials_of(&request), "the status")
            .map_err(|error| Status::from(error_of(error)))?;
        let status = self.node.status();
        let (raft, state) = (status.raft, status.state);
        let leadership = self.node.consensus().leadership();
        let applied = raft.applied_index.unwrap_or(0);
        let store_bytes = i64::try_from(state.store_bytes).unwrap_or(i64::MAX);
        let quota = self
            .node
            .consensus()
            .with_state(|s| s.limits().store_bytes_max);
        let is_learner = raft
            .members
            .iter()
            .any(|member| member.id == raft.id && !member.voter);
        // As etcd: every alarm of the cluster, as its text.
        let errors = self
            .alarms()
            .iter()
            .map(|alarm| format!("memberID:{} alarm:NOSPACE ", alarm.member_id))
            .collect();
        Ok(Response::new(StatusResponse {
            header: Some(self.header(applied)),
            version: self.version.to_string(),
            db_size: store_bytes,
            leader: leadership.leader_id.unwrap_or(0),
            raft_index: raft.commit_index.unwrap_or(0),
            raft_term: leadership.term,
            raft_applied_index: applied,
            errors,
            db_size_in_use: store_bytes,
            is_learner,
            storage_version: String::new(),
            db_size_quota: i64::try_from(quota).unwrap_or(i64::MAX),
            downgrade_info: None,
        }))
    }

    async fn alarm(
        &self,
        request: tonic::Request<AlarmRequest>,
    ) -> Result<Response<AlarmResponse>, Status> {
        self.node
            .require_admin(&credentials_of(&request), "alarms")
            .map_err(|error| Status::from(error_of(error)))?;
        let asked = *request.get_ref();
        let alarm = asked.alarm();
        let change = match asked.action() {
            // As etcd: the alarms of the type asked, every one for NONE.
            AlarmAction::Get => None,
            // As etcd: raising or clearing NONE changes nothing.
            _ if alarm == AlarmType::None => Some(None),
            AlarmAction::Activate if alarm == AlarmType::Corrupt => {
                return Err(EtcdError::Unsupported(
                    "raising a CORRUPT alarm (a member's data is checked by `oncekv verify` and \
                     HashKV, and a damaged log refuses to start)"
                        .to_string(),
                )
                .into());
            }
            // No CORRUPT alarm is ever raised.
            AlarmAction::Deactivate if alarm == AlarmType::Corrupt => Some(None),
            AlarmAction::Activate => Some(Some(true)),
            AlarmAction::Deactivate => Some(Some(false)),
        };
        let alarms = match change {
            None => self
                .alarms()
                .into_iter()
                .filter(|listed| alarm == AlarmType::None || listed.alarm == alarm as i32)
                .collect(),
            Some(None) => Vec::new(),
            Some(Some(raise)) => {
                if let Route::Leader(channel) = self.route(&request).await? {
                    let request = self.forwarded(request);
                    return answered(MaintenanceClient::new(channel).alarm(request).await);
                }
                let member = asked.member_id;
                let set = Command::AlarmSet { member, raise };
                let (reply, applied) = self.write(&request, set).await?;
                // As etcd: the alarm raised or cleared, if that changed it.
                let changed = matches!(reply, oncekv_state::Reply::AlarmSet { changed: true });
                let alarms = changed
                    .then_some(AlarmMember {
                        member_id: member,
                        alarm: AlarmType::Nospace as i32,
                    })
                    .into_iter()
                    .collect();
                return Ok(Response::new(AlarmResponse {
                    header: Some(self.header(applied)),
                    alarms,
                }));
            }
        };
        let applied = self.node.status().raft.applied_index.unwrap_or(0);
        Ok(Response::new(AlarmResponse {
            header: Some(self.header(applied)),
            alarms,
        }))
    }

    async fn defragment(
        &self,
        request: tonic::Request<DefragmentRequest>,
    ) -> Result<Response<DefragmentResponse>, Status> {
        self.node
            .require_admin(&credentials_of(&request), "defragmenting")
            .map_err(|error| Status::from(error_of(error)))?;
        let applied = self.node.status().raft.applied_index.unwrap_or(0);
        Ok(Response::new(DefragmentResponse {
            header: Some(self.header(applied)),
        }))
    }

    async fn hash(
        &self,
        request: tonic::Request<HashRequest>,
    ) -> Result<Response<HashResponse>, Status> {
        self.node
            .require_admin(&credentials_of(&request), "the hash")
            .map_err(|error| Status::from(error_of(error)))?;
        let (applied, digest) = self.node.state_digest().await;
        Ok(Response::new(HashResponse {
            header: Some(self.header(applied.map_or(0, |index| index.0))),
            hash: fold_to_32_bits(digest),
        }))
    }

    async fn hash_kv(
        &self,
        request: tonic::Request<HashKvRequest>,
    ) -> Result<Response<HashKvResponse>, Status> {
        self.node
            .require_admin(&credentials_of(&request), "the hash")
            .map_err(|error| Status::from(error_of(error)))?;
        let asked = super::revision_from_wire(request.get_ref().revision);
        // A copy costs a few pointers; the hash is computed from it off
        // the async threads while applies go on, one at a time.
        let hashed = self
            .node
            .over_state_copy(move |state| kv_hash(&state, asked))
            .await
            .map_err(|rejection| Status::from(EtcdError::of_rejection(&rejection)))?;
        Ok(Response::new(HashKvResponse {
            header: Some(self.header(hashed.applied)),
            hash: hashed.hash,
            compact_revision: hashed.compacted.map_or(-1, |compacted| {
                super::revision_to_wire(super::etcd_compaction(compacted))
            }),
            hash_revision: super::revision_to_wire(hashed.revision),
        }))
    }

    async fn move_leader(
        &self,
        request: tonic::Request<MoveLeaderRequest>,
    ) -> Result<Response<MoveLeaderResponse>, Status> {
        self.node
            .require_admin(&credentials_of(&request), "moving the leader")
            .map_err(|error| Status::from(error_of(error)))?;
        let consensus = self.node.consensus();
        // etcd serves it on the leader only (its clients find the leader
        // first); nothing is forwarded.
        match consensus.leading() {
            Ok(_) => {}
            Err(WriteError::NotLeader { .. }) => return Err(EtcdError::NotLeader.into()),
            Err(error) => return Err(error_of(error).into()),
        }
        let target = request.get_ref().target_id;
        let transferee = consensus
            .membership()
            .members
            .into_iter()
            .find(|member| member.id == target);
        if !transferee.is_some_and(|member| member.voter) {
            return Err(EtcdError::BadLeaderTransferee.into());
        }
        if target != self.node.id() {
            consensus
                .transfer_leader(target)
                .await
                .map_err(|error| Status::from(error_of(error)))?;
            if !consensus.wait_for_leader(target).await {
                return Err(EtcdError::LeaderTransferTimeout.into());
            }
        }
        let applied = self.node.status().raft.applied_index.unwrap_or(0);
        Ok(Response::new(MoveLeaderResponse {
            header: Some(self.header(applied)),
        }))
    }

    async fn snapshot(
        &self,
        request: tonic::Request<SnapshotRequest>,
    ) -> Result<Response<BoxStream<SnapshotResponse>>, Status> {
        self.node
            .require_admin(&credentials_of(&request), "saving a snapshot")
            .map_err(|error| Status::from(error_of(error)))?;
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            let chunks = answered(
                MaintenanceClient::new(channel)
                    .max_decoding_message_size(2 * SNAPSHOT_CHUNK_BYTES)
                    .snapshot(request)
                    .await,
            )?;
            return Ok(Response::new(Box::pin(futures_util::StreamExt::map(
                chunks.into_inner(),
                answered,
            ))));
        }
        let backup = self
            .node
            .backup()
            .await
            .map_err(|error| Status::from(error_of(error)))?;
        let header = self.header(backup.applied_index().0);
        let total = backup.etcd_len();
        let version = self.version.clone();
        // Read from the backup's file as the pieces are sent: the state is
        // never in memory whole. The last piece is the trailing SHA-256, as
        // etcd sends it.
        let mut sent: u64 = 0;
        let chunks = backup
            .into_etcd_pieces(SNAPSHOT_CHUNK_BYTES)
            .map(move |piece| match piece {
                Ok(blob) => {
                    sent = sent.saturating_add(blob.len() as u64);
                    Ok(SnapshotResponse {
                        header: Some(header),
                        remaining_bytes: total.saturating_sub(sent),
                        blob,
                        version: version.to_string(),
                    })
                }
                Err(error) => Err(Status::unavailable(format!(
                    "etcdserver: reading the snapshot failed: {error}"
                ))),
            });
        Ok(Response::new(Box::pin(futures_util::stream::iter(chunks))))
    }
}

/// A 64-bit digest as etcd's 32-bit hash: its halves XORed.
fn fold_to_32_bits(digest: u64) -> u32 {
    let [a, b, c, d, e, f, g, h] = digest.to_be_bytes();
    u32::from_be_bytes([a, b, c, d]) ^ u32::from_be_bytes([e, f, g, h])
}

/// A hash of the keys at a revision ([`kv_hash`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct KvHash {
    /// The hash.
    hash: u32,
    /// The revision it was taken at.
    revision: u64,
    /// The history's compacted revision, if any was compacted.
    compacted: Option<u64>,
    /// The state's applied index.
    applied: u64,
}

/// The CRC-32 of the keys of `state` as they were at revision `asked` (0:
/// now, the applied index): each live key with its value, lease and
/// revisions, in key order, every field framed by its length. Refused as
/// reads at that revision are (compacted, or in the future).
fn kv_hash(state: &StateMachine, asked: u64) -> Result<KvHash, oncekv_state::Rejection> {
    let applied = state.last_applied().map_or(0, |index| index.0);
    let revision = if asked == 0 { applied } else { asked };
    let kv = state.kv();
    kv.check_readable(revision, applied)?;
    let compacted = kv.history().compacted();
    if revision < super::etcd_compaction(compacted) {
        return Err(oncekv_state::Rejection::Compacted {
            revision,
            compacted,
        });
    }
    // What each key changed after `revision` was then (absent: `None`),
    // from its first later change.
    let mut then: BTreeMap<&[u8], Option<&StoredValue>> = BTreeMap::new();
    if let Some(after) = revision.checked_add(1) {
        for event in kv.history().since(after)? {
            then.entry(event.key.as_slice())
                .or_insert(event.previous.as_deref());
        }
    }
    let mut hasher = crc32fast::Hasher::new();
    let mut add = |key: &[u8], stored: &StoredValue| {
        let frame = |hasher: &mut crc32fast::Hasher, bytes: &[u8]| {
            hasher.update(&(bytes.len() as u64).to_le_bytes());
            hasher.update(bytes);
        };
        frame(&mut hasher, key);
        frame(&mut hasher, &stored.value);
        match &stored.lease {
            Some(lease) => {
                hasher.update(&[1]);
                frame(&mut hasher, lease.as_bytes());
            }
            None => hasher.update(&[0]),
        }
        let meta = &stored.meta;
        for number in [meta.create_revision, meta.mod_revision, meta.version] {
            hasher.update(&number.to_le_bytes());
        }
    };
    // The keys now, with those changed since replaced by what they were:
    // a merge of two key-ordered sequences.
    let mut now = kv.iter().peekable();
    let mut changed = then.into_iter().peekable();
    loop {
        let from_then = match (now.peek(), changed.peek()) {
            (None, None) => break,
            (Some(_), None) => false,
            (None, Some(_)) => true,
            (Some((current, _)), Some((key, _))) => *key <= current.as_slice(),
        };
        if !from_then {
            if let Some((key, stored)) = now.next() {
                add(key, stored);
            }
            continue;
        }
        if let Some((key, was)) = changed.next() {
            if now
                .peek()
                .is_some_and(|(current, _)| current.as_slice() == key)
            {
                now.next();
            }
            if let Some(stored) = was {
                add(key, stored);
            }
        }
    }
    let compacted = kv.history().compacted();
    Ok(KvHash {
        hash: hasher.finalize(),
        revision,
        compacted: (compacted > 0).then_some(compacted),
        applied,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncekv_state::{ClusterTime, Entry, Limits, LogIndex, Proposal, Rejection, Request};

    #[test]
    fn a_digest_folds_to_32_bits() {
        assert_eq!(fold_to_32_bits(0x0000_0001_0000_0002), 3);
        assert_eq!(fold_to_32_bits(0xffff_ffff_ffff_ffff), 0);
    }

    fn apply(machine: &mut StateMachine, index: u64, command: Command) {
        machine.apply(&Entry {
            index: LogIndex(index),
            proposal: Proposal {
                time: ClusterTime(0),
                principal: None,
                request: Request::plain(command),
            },
        });
    }

    fn put(key: &str, value: &str) -> Command {
        Command::Put {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec().into(),
            lease: None,
        }
    }

    #[test]
    fn the_keys_at_a_past_revision_hash_as_they_did_then() {
        let mut machine = StateMachine::new(Limits::default());
        apply(&mut machine, 1, put("a", "1"));
        apply(&mut machine, 2, put("b", "1"));
        apply(&mut machine, 3, put("d", "1"));
        let then = kv_hash(&machine, 0).expect("a hash now");
        assert_eq!((then.revision, then.applied, then.compacted), (3, 3, None));
        // Changed, deleted, created, before and after the others in key
        // order.
        apply(&mut machine, 4, put("a", "2"));
        apply(&mut machine, 5, Command::Delete { key: b"b".to_vec() });
        apply(&mut machine, 6, put("c", "1"));
        apply(&mut machine, 7, put("0", "1"));
        apply(&mut machine, 8, put("d", "2"));
        let now = kv_hash(&machine, 0).expect("a hash now");
        assert_ne!(now.hash, then.hash);
        assert_eq!(kv_hash(&machine, 3).map(|past| past.hash), Ok(then.hash));
        assert_eq!(kv_hash(&machine, 8).map(|same| same.hash), Ok(now.hash));
        assert!(matches!(
            kv_hash(&machine, 9),
            Err(Rejection::FutureRevision { .. })
        ));
        // etcd's Compact(6): the node's history keeps revision 6 on.
        let revision = super::super::compaction_to(6);
        apply(&mut machine, 9, Command::Compact { revision });
        for below in [3, 5] {
            assert!(matches!(
                kv_hash(&machine, below),
                Err(Rejection::Compacted { .. })
            ));
        }
        let at_compaction = kv_hash(&machine, 6).expect("the compaction revision");
        assert_eq!(at_compaction.compacted, Some(5));
        assert_eq!(kv_hash(&machine, 9).map(|same| same.hash), Ok(now.hash));
    }
}
