//! `etcdserverpb.Maintenance` onto the node: Status from the node's
//! consensus progress and store counters (what `etcdctl endpoint status`
//! shows); Alarm (the store's `NOSPACE` alarm, which is the cluster's:
//! listed for every member, disarmed through the log); Defragment, which
//! has nothing to do (the store is in memory, the log compacts itself)
//! and succeeds; Snapshot, a backup taken on the leader (as `oncekv
//! snapshot save` takes it) streamed in chunks and ended by the SHA-256 of
//! all of it, as etcd ends its own (`oncekv snapshot restore` reads the
//! file `etcdctl snapshot save` writes). Like the native status and alarms, they need the admin
//! role while authentication is enforced.

use super::errors::{EtcdError, error_of};
use super::forward::{Route, answered};
use super::{EtcdApi, credentials_of};
use oncekv_proto::etcd::etcdserverpb::alarm_request::AlarmAction;
use oncekv_proto::etcd::etcdserverpb::maintenance_client::MaintenanceClient;
use oncekv_proto::etcd::etcdserverpb::maintenance_server::Maintenance;
use oncekv_proto::etcd::etcdserverpb::{
    AlarmMember, AlarmRequest, AlarmResponse, AlarmType, DefragmentRequest, DefragmentResponse,
    SnapshotRequest, SnapshotResponse, StatusRequest, StatusResponse,
};
use tonic::codegen::BoxStream;

/// Bytes per chunk of a streamed snapshot.
const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;
use oncekv_state::Command;
use tonic::{Response, Status};

/// The etcd version the node reports by default: the release whose API
/// (as far as it reaches) the node serves. Clients gate features on it
/// (Kubernetes sends watch progress requests only to 3.5.13 and later);
/// `serve --etcd-version` changes it.
pub const ETCD_VERSION: &str = "3.4.0";

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
        let errors = if state.no_space_alarm {
            vec![format!("memberID:{} alarm:NOSPACE ", raft.id)]
        } else {
            Vec::new()
        };
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
        match asked.action() {
            AlarmAction::Get => {}
            AlarmAction::Activate => {
                return Err(EtcdError::Unsupported(
                    "raising an alarm by hand (the node raises NOSPACE itself)".to_string(),
                )
                .into());
            }
            AlarmAction::Deactivate => {
                if asked.alarm() == AlarmType::Nospace {
                    if let Route::Leader(channel) = self.route(&request)? {
                        let request = self.forwarded(request);
                        return answered(MaintenanceClient::new(channel).alarm(request).await);
                    }
                    self.write(&request, Command::AlarmDisarm).await?;
                }
            }
        }
        let status = self.node.status();
        let alarms = if status.state.no_space_alarm {
            status
                .raft
                .members
                .iter()
                .map(|member| AlarmMember {
                    member_id: member.id,
                    alarm: AlarmType::Nospace as i32,
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(Response::new(AlarmResponse {
            header: Some(self.header(status.raft.applied_index.unwrap_or(0))),
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

    async fn snapshot(
        &self,
        request: tonic::Request<SnapshotRequest>,
    ) -> Result<Response<BoxStream<SnapshotResponse>>, Status> {
        self.node
            .require_admin(&credentials_of(&request), "saving a snapshot")
            .map_err(|error| Status::from(error_of(error)))?;
        if let Route::Leader(channel) = self.route(&request)? {
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
        let header = self.header(backup.applied_index.0);
        let bytes = backup.encode_for_etcd();
        drop(backup);
        // Chunks are cut as they are sent: the bytes are held once. The
        // last chunk is the trailing SHA-256, as etcd sends it.
        let body_end = bytes.len().saturating_sub(32);
        let mut cuts: Vec<(usize, usize)> = (0..body_end)
            .step_by(SNAPSHOT_CHUNK_BYTES)
            .map(|start| (start, (start + SNAPSHOT_CHUNK_BYTES).min(body_end)))
            .collect();
        cuts.push((body_end, bytes.len()));
        let total = bytes.len();
        let version = self.version.clone();
        let chunks = cuts.into_iter().map(move |(start, end)| {
            Ok(SnapshotResponse {
                header: Some(header),
                remaining_bytes: (total - end) as u64,
                blob: bytes[start..end].to_vec(),
                version: version.to_string(),
            })
        });
        Ok(Response::new(Box::pin(futures_util::stream::iter(chunks))))
    }
}
