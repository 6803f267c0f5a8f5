//! The oncekv wire contract: the protobuf package `oncekv.v1` (client API
//! `Kv`, peer API `RaftPeer`) generated with tonic, and [`convert`], the one
//! place that maps between wire messages and the state machine's types;
//! and etcd's v3 API ([`etcd`]), generated from etcd's own definitions
//! (`proto/etcd-api`), which the node serves as an adapter. One message,
//! `ExecuteBatchRequest`, is written by hand ([`batch`]) so that decoding
//! it refuses more than [`BATCH_REQUESTS_MAX`] requests as it counts them.
//! The wire's constants (metadata names, the batch limit) are defined
//! here and only here (`tests/tidy.rs` fails on a copy in another crate).

pub mod batch;
pub mod convert;

/// Generated code of the `oncekv.v1` protobuf package.
#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations
)]
pub mod v1 {
    tonic::include_proto!("oncekv.v1");
    pub use crate::batch::ExecuteBatchRequest;
}

/// The encoded file descriptor set of `oncekv.v1`, for gRPC server
/// reflection (so `grpcurl` can list and call the services).
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("oncekv");

/// Generated code of etcd's v3 API, in etcd's package names (so the
/// method paths are etcd's, such as `/etcdserverpb.KV/Range`).
#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    missing_debug_implementations
)]
pub mod etcd {
    /// `etcdserverpb`: KV, Watch, Lease, Cluster, Maintenance, Auth.
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }
    /// `mvccpb`: a key-value pair and a watch event.
    pub mod mvccpb {
        tonic::include_proto!("mvccpb");
    }
    /// `authpb`: users, roles and permissions.
    pub mod authpb {
        tonic::include_proto!("authpb");
    }
    /// `v3lockpb`: the Lock service.
    pub mod v3lockpb {
        tonic::include_proto!("v3lockpb");
    }
    /// `v3electionpb`: the Election service.
    pub mod v3electionpb {
        tonic::include_proto!("v3electionpb");
    }
}

/// The encoded file descriptor set of etcd's v3 API, for gRPC server
/// reflection.
pub const ETCD_FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("etcd");

/// The metadata entry a node sets on a call it refused unhandled because
/// a limit was full (status RESOURCE_EXHAUSTED); its value names the
/// limit. Such a request definitely did not apply, and clients read the
/// entry, never the message text.
pub const OVERLOADED_METADATA: &str = "oncekv-overloaded";

/// The gRPC metadata entry that makes a call of etcd's API idempotent: its
/// value (1..=128 bytes) names the write, and a resend with the same value
/// is answered with the first one's response and applies nothing.
pub const IDEMPOTENCY_KEY_METADATA: &str = "oncekv-idempotency-key";

/// The gRPC metadata entry a client's call carries its login token in:
/// `authorization: Bearer <token>` ([`BEARER`] before the token).
pub const AUTHORIZATION_METADATA: &str = "authorization";

/// What comes before the token in [`AUTHORIZATION_METADATA`]'s value.
pub const BEARER: &str = "Bearer ";

/// The gRPC metadata entry every call of the peer API (`RaftPeer`)
/// carries the cluster's peer credential in, when the cluster has a peer
/// token.
pub const PEER_TOKEN_METADATA: &str = "oncekv-peer-token";

/// The gRPC metadata entry on an etcd call one member forwards to the
/// leader's peer port: the forwarding member's node id. The leader serves
/// such a call only from a member authenticated as that node (its peer
/// certificate for `node-<id>`, or the peer token); on a client port the
/// entry means nothing.
pub const FORWARDED_BY_METADATA: &str = "oncekv-forwarded-by";

/// The gRPC metadata entry on a forwarded etcd call naming its caller's
/// source address, as the forwarding member saw it.
pub const FORWARDED_FOR_METADATA: &str = "oncekv-forwarded-for";

/// The binary gRPC metadata entry on a forwarded etcd call holding the
/// Common Name (UTF-8) of the client certificate the forwarding member
/// verified on the caller's connection (absent: none).
pub const FORWARDED_CERTIFICATE_USER_METADATA: &str = "oncekv-forwarded-certificate-user-bin";

/// The binary gRPC metadata entry on a forwarded etcd call holding the
/// serial number (big-endian bytes) of that client certificate, so that
/// the leader refuses a revoked one.
pub const FORWARDED_CERTIFICATE_SERIAL_METADATA: &str = "oncekv-forwarded-certificate-serial-bin";

/// Most requests one `ExecuteBatch` message may carry.
pub const BATCH_REQUESTS_MAX: usize = 256;
