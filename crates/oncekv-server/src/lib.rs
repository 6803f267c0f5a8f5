//! The oncekv node: openraft consensus over a durable log, the exactly-once
//! state machine of `oncekv-state`, and the gRPC services for clients and
//! peers.

pub mod auth;
pub mod backup;
pub mod clock;
pub mod grpc;
pub mod identity;
pub mod login_guard;
pub mod node;
pub mod private_fs;
pub mod raft;
pub mod server;
pub mod sync;
pub mod telemetry;
pub mod tls;
pub mod transport;
pub mod watch;
