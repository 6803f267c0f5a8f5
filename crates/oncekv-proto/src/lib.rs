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
