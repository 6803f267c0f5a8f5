//! `etcdserverpb.Lease` onto the node's named leases: etcd's numbered
//! lease `ID` is the node's lease named `etcd-<ID in 16 hex digits>`
//! ([`lease_name`], [`lease_id`]), so a lease granted through either API
//! is the same lease; leases named otherwise are not listed here. Grant,
//! revoke and keep-alive are commands through the log, deduplicated like
//! every write (a grant resent with the idempotency metadata is granted
//! once and answered with the same ID); TimeToLive and Leases read the
//! applied state after a read barrier.
//!
//! A lease is its granter's: while authentication is enforced, grant (of
//! an ID that exists), revoke, keep-alive and TimeToLive of another user's
//! lease are refused with etcd's "permission denied" (an admin may use any
//! lease), and Leases lists only the caller's (all of them for an admin).
//! The state machine decides it for the writes; TimeToLive asks the same
//! rule of the state it reads.
//!
//! TTLs are whole seconds on etcd's wire and milliseconds in the node: a
//! TTL under the node's minimum is raised to it (as etcd raises it to
//! its own), one over its maximum is refused.

use super::errors::{EtcdError, error_of};
use super::forward::{Route, answered};
use super::{EtcdApi, fnv1a};
use futures_util::StreamExt;
use oncekv_proto::IDEMPOTENCY_KEY_METADATA;
use oncekv_proto::etcd::etcdserverpb::lease_client::LeaseClient;
use oncekv_proto::etcd::etcdserverpb::lease_server::Lease;
use oncekv_proto::etcd::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseLeasesRequest, LeaseLeasesResponse, LeaseRevokeRequest, LeaseRevokeResponse, LeaseStatus,
    LeaseTimeToLiveRequest, LeaseTimeToLiveResponse,
};
use oncekv_state::{Command, Query, Rejection, Reply};
use tonic::codegen::BoxStream;
use tonic::{Response, Status};

/// The prefix of the node's name for an etcd lease.
const NAME_PREFIX: &str = "etcd-";

/// The node's name of etcd's lease `id`.
pub(super) fn lease_name(id: i64) -> String {
    format!("{NAME_PREFIX}{id:016x}")
}

/// etcd's ID of the node's lease `name`, if it is one of etcd's.
pub(super) fn lease_id(name: &str) -> Option<i64> {
    let hex = name.strip_prefix(NAME_PREFIX)?;
    if hex.len() != 16 {
        return None;
    }
    i64::from_str_radix(hex, 16).ok().filter(|id| *id > 0)
}

/// Milliseconds in whole seconds, rounded up (a lease never looks shorter
/// than it is).
fn seconds(ms: u64) -> i64 {
    i64::try_from(ms.div_ceil(1000)).unwrap_or(i64::MAX)
}

/// The ID a grant that asked for none gets: from its idempotency key when
/// it has one (so its resend names the same lease, and is the same
/// request), else drawn at random; always positive.
fn chosen_id<T>(request: &tonic::Request<T>) -> i64 {
    let bits = match request.metadata().get(IDEMPOTENCY_KEY_METADATA) {
        Some(key) => fnv1a(key.as_bytes()),
        // The low half of a fresh secret's bits.
        None => crate::node::Node::draw_secret().0 as u64,
    };
    i64::try_from(bits >> 1).unwrap_or(1).max(1)
}

impl EtcdApi {
    /// The node's lease limits: shortest and longest TTL, in ms.
    fn ttl_bounds(&self) -> (u64, u64) {
        self.node.consensus().with_state(|state| {
            let limits = state.limits();
            (limits.lease_ttl_ms_min, limits.lease_ttl_ms_max)
        })
    }

    /// A Lease client of the leader, over `channel`.
    fn leader_lease(
        &self,
        channel: tonic::transport::Channel,
    ) -> LeaseClient<tonic::transport::Channel> {
        LeaseClient::new(channel)
            .max_decoding_message_size(self.message_bytes_max)
            .max_encoding_message_size(self.message_bytes_max)
    }

    /// Keeps `id` alive; its TTL in seconds, 0 if it does not exist.
    async fn keep_alive(
        &self,
        request: &tonic::Request<()>,
        id: i64,
    ) -> Result<LeaseKeepAliveResponse, Status> {
        let name = lease_name(id);
        let (reply, revision) = self
            .write(request, Command::LeaseKeepAlive { name: name.clone() })
            .await?;
        let ttl = match reply {
            Reply::LeaseKeptAlive { .. } => self
                .node
                .consensus()
                .with_state(|state| state.leases().get(&name).map(|l| seconds(l.ttl_ms)))
                .unwrap_or(0),
            Reply::Rejected(Rejection::LeaseNotFound { .. }) => 0,
            Reply::Rejected(rejection) => return Err(EtcdError::of_rejection(&rejection).into()),
            other => return Err(EtcdError::Invalid(format!("unexpected reply {other:?}")).into()),
        };
        Ok(LeaseKeepAliveResponse {
            header: Some(self.header(revision)),
            id,
            ttl,
        })
    }
}

#[tonic::async_trait]
impl Lease for EtcdApi {
    async fn lease_grant(
        &self,
        request: tonic::Request<LeaseGrantRequest>,
    ) -> Result<Response<LeaseGrantResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_lease(channel).lease_grant(request).await);
        }
        let grant = request.get_ref();
        let id = if grant.id > 0 {
            grant.id
        } else if grant.id == 0 {
            chosen_id(&request)
        } else {
            return Err(EtcdError::Invalid(format!("lease ID {} is negative", grant.id)).into());
        };
        let (min_ms, max_ms) = self.ttl_bounds();
        let asked_ms = u64::try_from(grant.ttl).unwrap_or(0).saturating_mul(1000);
        if asked_ms > max_ms {
            return Err(EtcdError::LeaseTtlTooLarge.into());
        }
        let ttl_ms = asked_ms.max(min_ms);
        let (reply, revision) = self
            .write(
                &request,
                Command::LeaseGrant {
                    name: lease_name(id),
                    ttl_ms,
                },
            )
            .await?;
        match reply {
            Reply::LeaseGranted { ttl_ms, .. } => Ok(Response::new(LeaseGrantResponse {
                header: Some(self.header(revision)),
                id,
                ttl: seconds(ttl_ms),
                error: String::new(),
            })),
            Reply::Rejected(rejection) => Err(EtcdError::of_rejection(&rejection).into()),
            other => Err(EtcdError::Invalid(format!("unexpected reply {other:?}")).into()),
        }
    }

    async fn lease_revoke(
        &self,
        request: tonic::Request<LeaseRevokeRequest>,
    ) -> Result<Response<LeaseRevokeResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_lease(channel).lease_revoke(request).await);
        }
        let name = lease_name(request.get_ref().id);
        let (reply, revision) = self.write(&request, Command::LeaseRevoke { name }).await?;
        match reply {
            Reply::LeaseRevoked { .. } => Ok(Response::new(LeaseRevokeResponse {
                header: Some(self.header(revision)),
            })),
            Reply::Rejected(rejection) => Err(EtcdError::of_rejection(&rejection).into()),
            other => Err(EtcdError::Invalid(format!("unexpected reply {other:?}")).into()),
        }
    }

    async fn lease_keep_alive(
        &self,
        request: tonic::Request<tonic::Streaming<LeaseKeepAliveRequest>>,
    ) -> Result<Response<BoxStream<LeaseKeepAliveResponse>>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            // The whole stream goes to the leader, and its answers back.
            let (metadata, extensions, requests) = self.forwarded(request).into_parts();
            let requests = requests
                .take_while(|request| std::future::ready(request.is_ok()))
                .filter_map(|request| std::future::ready(request.ok()));
            let request = tonic::Request::from_parts(metadata, extensions, requests);
            let answers = answered(self.leader_lease(channel).lease_keep_alive(request).await)?;
            let answers = answers.into_inner().map(answered);
            return Ok(Response::new(Box::pin(answers)));
        }
        // Each keep-alive is a write of its own, with the call's metadata
        // (credentials) but never its idempotency key: a keep-alive is
        // meant to apply every time.
        let mut metadata = request.metadata().clone();
        metadata.remove(IDEMPOTENCY_KEY_METADATA);
        let extensions = request.extensions().clone();
        let mut requests = request.into_inner();
        let api = self.clone();
        let (sender, receiver) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            loop {
                let next = match requests.message().await {
                    Ok(Some(next)) => next,
                    Ok(None) | Err(_) => return,
                };
                let call = tonic::Request::from_parts(metadata.clone(), extensions.clone(), ());
                let answer = api.keep_alive(&call, next.id).await;
                let failed = answer.is_err();
                if sender.send(answer).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
        )))
    }

    async fn lease_time_to_live(
        &self,
        request: tonic::Request<LeaseTimeToLiveRequest>,
    ) -> Result<Response<LeaseTimeToLiveResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_lease(channel).lease_time_to_live(request).await);
        }
        let asked = *request.get_ref();
        let name = lease_name(asked.id);
        let principal = self.principal(&request, true)?;
        let (_, revision, found) = self
            .node
            .read_then(&Query::LeaseList, false, principal.as_ref(), |state, _| {
                state.leases().get(&name).map(|lease| {
                    if !state
                        .auth()
                        .may_use_lease(principal.as_ref(), lease.owner.as_ref())
                    {
                        return Err(EtcdError::PermissionDenied);
                    }
                    let now = state.cluster_time().0;
                    let remaining = lease.expires_at.0.saturating_sub(now);
                    // Only the keys the caller may read are named.
                    let readable = |key: &Vec<u8>| {
                        let get = Query::Get { key: key.clone() };
                        state.check_query(principal.as_ref(), &get).is_ok()
                    };
                    let keys = if asked.keys {
                        lease.keys.iter().filter(|k| readable(k)).cloned().collect()
                    } else {
                        Vec::new()
                    };
                    Ok((seconds(remaining), seconds(lease.ttl_ms), keys))
                })
            })
            .await
            .map_err(|error| Status::from(error_of(error)))?;
        // An unknown lease is not an error: its TTL is -1, as on etcd.
        let (ttl, granted_ttl, keys) = found.transpose()?.unwrap_or((-1, 0, Vec::new()));
        Ok(Response::new(LeaseTimeToLiveResponse {
            header: Some(self.header(revision)),
            id: asked.id,
            ttl,
            granted_ttl,
            keys,
        }))
    }

    async fn lease_leases(
        &self,
        request: tonic::Request<LeaseLeasesRequest>,
    ) -> Result<Response<LeaseLeasesResponse>, Status> {
        if let Route::Leader(channel) = self.route(&request).await? {
            let request = self.forwarded(request);
            return answered(self.leader_lease(channel).lease_leases(request).await);
        }
        let (reply, revision) = self.read(&request, &Query::LeaseList, false).await?;
        let Reply::Leases { leases } = reply else {
            return Err(EtcdError::Invalid(format!("unexpected reply {reply:?}")).into());
        };
        Ok(Response::new(LeaseLeasesResponse {
            header: Some(self.header(revision)),
            leases: leases
                .iter()
                .filter_map(|lease| lease_id(&lease.name))
                .map(|id| LeaseStatus { id })
                .collect(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_and_names_map_one_to_one() {
        for id in [1, 0x694d_7ccb_0b35_a10b, i64::MAX] {
            assert_eq!(lease_id(&lease_name(id)), Some(id));
        }
        assert_eq!(lease_id("jobs"), None);
        assert_eq!(lease_id("etcd-0000000000000000"), None);
        assert_eq!(lease_id("etcd-12"), None);
    }

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(seconds(0), 0);
        assert_eq!(seconds(1), 1);
        assert_eq!(seconds(60_000), 60);
        assert_eq!(seconds(60_001), 61);
    }

    #[test]
    fn a_keyed_grant_names_the_same_lease_every_time() {
        let keyed = || {
            let mut request = tonic::Request::new(());
            request.metadata_mut().insert(
                IDEMPOTENCY_KEY_METADATA,
                "grant-1".parse().expect("metadata"),
            );
            request
        };
        assert_eq!(chosen_id(&keyed()), chosen_id(&keyed()));
        assert!(chosen_id(&keyed()) > 0);
        assert!(chosen_id(&tonic::Request::new(())) > 0);
    }
}
