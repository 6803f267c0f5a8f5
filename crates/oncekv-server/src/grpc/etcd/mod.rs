//! etcd's v3 API on the client port: [`EtcdApi`] answers etcd's services
//! (`etcdserverpb.KV`, `Watch`, `Lease`, `Cluster`, `Maintenance`,
//! `Auth`; `v3lockpb.Lock`, `v3electionpb.Election`) as an adapter onto the
//! node's own commands, queries and state, so an etcd `Put` and a native
//! PUT of one key see each other at one revision. Revisions are the
//! node's (log indexes: they only grow, but not one by one).
//!
//! What is served, field by field, and what differs from etcd is in
//! `docs/etcd-compatibility.md`; a method not served answers
//! UNIMPLEMENTED. A call carrying the metadata
//! [`oncekv_proto::IDEMPOTENCY_KEY_METADATA`] is applied once per key (scoped to the
//! caller's user, as native keys are): a retry gets the original
//! response, its header revision included. Errors carry the codes and
//! texts etcd's clients match on, from one table (`errors`).
//!
//! Any member accepts every call: writes and linearizable reads are
//! carried out by the leader, to which a follower forwards them over the
//! peer port (`forward`, whose [`MemberCheck`] admits them there only
//! from an authenticated member); watches and serializable reads are
//! served by any member from its applied state.

mod auth;
mod cluster;
mod election;
mod errors;
mod forward;
/// The conversions of the handlers, without a node, for the fuzz target
/// `etcd_request` (`crates/oncekv-fuzz`). Not an API.
#[doc(hidden)]
pub mod fuzzing;
mod kv;
mod lease;
mod lock;
mod maintenance;
mod watch;

use crate::auth::Credentials;
use crate::identity::fnv1a;
use crate::node::Node;
use oncekv_proto::IDEMPOTENCY_KEY_METADATA;
use oncekv_proto::etcd::etcdserverpb::ResponseHeader;
use oncekv_proto::etcd::etcdserverpb::auth_server::AuthServer;
use oncekv_proto::etcd::etcdserverpb::cluster_server::ClusterServer;
use oncekv_proto::etcd::etcdserverpb::kv_server::KvServer;
use oncekv_proto::etcd::etcdserverpb::lease_server::LeaseServer;
use oncekv_proto::etcd::etcdserverpb::maintenance_server::MaintenanceServer;
use oncekv_proto::etcd::etcdserverpb::watch_server::WatchServer;
use oncekv_proto::etcd::v3electionpb::election_server::ElectionServer;
use oncekv_proto::etcd::v3lockpb::lock_server::LockServer;
use oncekv_state::{IdempotencyKey, Origin, Principal};
use std::sync::{Arc, OnceLock};
use tonic::Status;

pub use errors::status_of;
pub use forward::{Forwarded, MemberCallRefused, MemberCheck};
pub use maintenance::ETCD_VERSION;

/// The metadata entry etcd's clients carry their login token in.
const TOKEN_METADATA: &str = "token";

/// The etcd services of one node.
#[derive(Clone, Debug)]
pub struct EtcdApi {
    node: Node,
    /// The cluster id headers carry: the one the state machine records
    /// (see [`EtcdApi::cluster_id`]), once seen.
    cluster_id: Arc<OnceLock<u64>>,
    /// The hash of the initial membership this node was started with,
    /// until the state machine has one.
    configured_cluster_id: u64,
    /// Whether the client port is on TLS (the scheme of the URLs members
    /// are listed with).
    client_tls: bool,
    /// Largest message forwarded to the leader or taken back.
    message_bytes_max: usize,
    leaders: forward::LeaderChannels,
    /// The etcd version reported.
    version: Arc<str>,
    /// The Lock and Campaign calls waiting here, by caller.
    waiters: Arc<lock::Waiters>,
}

impl EtcdApi {
    /// The services over `node`, in the cluster whose description (the
    /// initial membership, as the data directory records it) is
    /// `cluster`: its hash is the cluster id headers carry until the state
    /// machine has recorded the cluster's own (the same, on a founding
    /// member). `client_tls` says whether the client port is on TLS;
    /// `message_bytes_max` is its message limit.
    pub fn new(node: Node, cluster: &str, client_tls: bool, message_bytes_max: usize) -> EtcdApi {
        EtcdApi {
            node,
            cluster_id: Arc::new(OnceLock::new()),
            configured_cluster_id: crate::identity::description_id(cluster),
            client_tls,
            message_bytes_max,
            leaders: forward::LeaderChannels::default(),
            version: Arc::from(ETCD_VERSION),
            waiters: Arc::default(),
        }
    }

    /// The same services, forwarding to the leader's peer port as
    /// `dialer` dials it (the node's peer transport, TLS and token;
    /// without it, plaintext TCP with no token).
    pub fn forwarding_with(mut self, dialer: crate::raft::network::PeerDialer) -> EtcdApi {
        self.leaders = forward::LeaderChannels::new(dialer);
        self
    }

    /// The same services, reporting etcd version `version`.
    pub fn reporting_version(mut self, version: &str) -> EtcdApi {
        self.version = Arc::from(version);
        self
    }

    /// The KV service.
    pub fn kv_server(&self, message_bytes_max: usize) -> KvServer<EtcdApi> {
        KvServer::new(self.clone())
            .max_decoding_message_size(message_bytes_max)
            .max_encoding_message_size(message_bytes_max)
    }

    /// The Lease service.
    pub fn lease_server(&self, message_bytes_max: usize) -> LeaseServer<EtcdApi> {
        LeaseServer::new(self.clone())
            .max_decoding_message_size(message_bytes_max)
            .max_encoding_message_size(message_bytes_max)
    }

    /// The Cluster service.
    pub fn cluster_server(&self, message_bytes_max: usize) -> ClusterServer<EtcdApi> {
        ClusterServer::new(self.clone())
            .max_decoding_message_size(message_bytes_max)
            .max_encoding_message_size(message_bytes_max)
    }

    /// The Watch service.
    pub fn watch_server(&self, message_bytes_max: usize) -> WatchServer<EtcdApi> {
        WatchServer::new(self.clone())
            .max_decoding_message_size(message_bytes_max)
            .max_encoding_message_size(message_bytes_max)
    }

    /// The Maintenance service.
    pub fn maintenance_server(&self, message_bytes_max: usize) -> MaintenanceServer<EtcdApi> {
        MaintenanceServer::new(self.clone())
            .max_decoding_message_size(message_bytes_max)
            .max_encoding_message_size(message_bytes_max)
    }

    /// The Lock service (`v3lockpb.Lock`).
    pub fn lock_server(&self, message_bytes_max: usize) -> LockServer<EtcdApi> {
        LockServer::new(self.clone())
            .max_decoding_message_size(message_bytes_max)
            .max_encoding_message_size(message_bytes_max)
    }

    /// The Election service (`v3electionpb.Election`).
    pub fn election_server(&self, message_bytes_max: usize) -> ElectionServer<EtcdApi> {
        ElectionServer::new(self.clone())
            .max_decoding_message_size(message_bytes_max)
            .max_encoding_message_size(message_bytes_max)
    }

    /// The Auth service.
    pub fn auth_server(&self, message_bytes_max: usize) -> AuthServer<EtcdApi> {
        AuthServer::new(self.clone())
            .max_decoding_message_size(message_bytes_max)
            .max_encoding_message_size(message_bytes_max)
    }

    /// The cluster's id: the one the state machine recorded (from the
    /// founding membership, or a backup's new cluster), so a member that
    /// joined later reports the founders' id; until it has one, the hash
    /// of the initial membership this node was started with.
    fn cluster_id(&self) -> u64 {
        if let Some(id) = self.cluster_id.get() {
            return *id;
        }
        match self.node.consensus().with_state(|state| state.cluster_id()) {
            // Recorded once, never changed: kept without the state lock.
            Some(id) => *self.cluster_id.get_or_init(|| id),
            None => self.configured_cluster_id,
        }
    }

    /// A response header at `revision`.
    fn header(&self, revision: u64) -> ResponseHeader {
        let leadership = self.node.consensus().leadership();
        ResponseHeader {
            cluster_id: self.cluster_id(),
            member_id: self.node.id(),
            revision: revision_to_wire(revision),
            raft_term: leadership.term,
        }
    }

    /// Who sent `request` ([`credentials_of`]). For a call only the
    /// leader carries out, a follower that cannot authenticate the caller
    /// yet answers "not leader" instead.
    fn principal<T>(
        &self,
        request: &tonic::Request<T>,
        at_leader: bool,
    ) -> Result<Option<Principal>, Status> {
        let credentials = credentials_of(request);
        let principal = if at_leader {
            self.node.authenticate_at_leader(&credentials)
        } else {
            self.node.authenticate(&credentials)
        };
        principal.map_err(status_of)
    }
}

/// What `request` presented: etcd's `token` metadata, or oncekv's own
/// `authorization`, and a client certificate: for a call a member
/// forwarded, the one that member verified on the caller's connection
/// (never the member's own peer certificate).
fn credentials_of<T>(request: &tonic::Request<T>) -> Credentials {
    let mut credentials = Credentials::of(request);
    if let Some(forwarded) = forward::forwarded_of(request) {
        credentials.certificate_user = forwarded.certificate_user.clone();
        credentials.certificate_serial = forwarded.certificate_serial.clone();
    }
    if credentials.token.is_none() {
        credentials.token = request
            .metadata()
            .get(TOKEN_METADATA)
            .and_then(|value| value.to_str().ok())
            .map(|value| value.trim().to_string());
    }
    credentials
}

/// How a write is deduplicated: by the caller's idempotency key, or not at
/// all (as etcd).
fn origin_of<T>(request: &tonic::Request<T>) -> Result<Origin, Status> {
    let Some(value) = request.metadata().get(IDEMPOTENCY_KEY_METADATA) else {
        return Ok(Origin::Plain);
    };
    let key = IdempotencyKey(value.as_bytes().to_vec());
    if !key.is_well_formed() {
        return Err(Status::invalid_argument(format!(
            "oncekv: the {IDEMPOTENCY_KEY_METADATA} metadata must be {}..={} bytes, got {}",
            IdempotencyKey::BYTES_MIN,
            IdempotencyKey::BYTES_MAX,
            key.0.len()
        )));
    }
    Ok(Origin::Key(key))
}

/// A revision as etcd's wire has it (an `i64`; the node's never reach
/// `i64::MAX`, and would be clamped there).
fn revision_to_wire(revision: u64) -> i64 {
    i64::try_from(revision).unwrap_or(i64::MAX)
}

/// A revision from etcd's wire: 0 and below mean "none".
fn revision_from_wire(revision: i64) -> u64 {
    u64::try_from(revision).unwrap_or(0)
}

/// etcd's compaction revision for the node's: the lowest revision still
/// read and watched from. The node's history drops the events at and
/// below its compacted revision C, so C + 1 is the first kept; etcd's
/// Compact(R) keeps R's, so it is the node's compaction to R - 1
/// ([`compaction_to`]). 0 while nothing is compacted.
fn etcd_compaction(node_compacted: u64) -> u64 {
    if node_compacted == 0 {
        0
    } else {
        node_compacted.saturating_add(1)
    }
}

/// The node's compaction that is etcd's Compact(`revision`): the events
/// below `revision` dropped, those at it kept ([`etcd_compaction`]).
fn compaction_to(revision: u64) -> u64 {
    revision.saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revisions_cross_the_wire_without_wrapping() {
        assert_eq!(revision_to_wire(u64::MAX), i64::MAX);
        assert_eq!(revision_to_wire(7), 7);
        assert_eq!(revision_from_wire(-1), 0);
        assert_eq!(revision_from_wire(9), 9);
    }

    #[test]
    fn the_cluster_id_is_a_stable_hash() {
        use crate::identity::description_id;
        // FNV-1a's published test vector.
        assert_eq!(description_id("a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(description_id("1=a:1,2=b:1"), description_id("1=a:1,2=b:2"));
    }
}
