//! The client API over gRPC: the `Kv` service, etcd's v3 API ([`etcd`]),
//! and the standard health and reflection services beside them.
//!
//! A `tonic::Status` means the message itself was refused (outcomes and
//! transient errors travel as typed response fields), and is built in
//! these places only: this module, `grpc/`, for the client API (etcd's
//! errors through one table, `etcd::errors`); `transport.rs`, for the refusals
//! before any handler runs (shed as overloaded, TLS required, a malformed
//! message); and the peer API's `raft/peer_service.rs` and
//! `raft/peer_token.rs`. The server's `tests/tidy.rs` fails on a status
//! built anywhere else.

pub mod etcd;
mod health;
mod kv_service;

pub use health::{health_service, reflection_service, serving};
pub use kv_service::KvService;
