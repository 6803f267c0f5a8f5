//! The oncekv wire contract: the protobuf package `oncekv.v1` (client API
//! `Kv`, peer API `RaftPeer`) generated with tonic, and [`convert`], the one
//! place that maps between wire messages and the state machine's types.

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
}

/// The encoded file descriptor set of `oncekv.v1`, for gRPC server
/// reflection (so `grpcurl` can list and call the services).
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("oncekv");

/// The metadata entry a node sets on a call it refused unhandled because
/// a limit was full (status RESOURCE_EXHAUSTED); its value names the
/// limit. Such a request definitely did not apply, and clients read the
/// entry, never the message text.
pub const OVERLOADED_METADATA: &str = "oncekv-overloaded";

/// Most requests one `ExecuteBatch` message may carry.
pub const BATCH_REQUESTS_MAX: usize = 256;
