//! The oncekv node: openraft consensus over a durable log, the exactly-once
//! state machine of `oncekv-state`, and the gRPC services for clients and
//! peers; and the certificates of a TLS cluster (`certs`, which `oncekv
//! certs` makes).
//!
//! The modules are layered: each uses only modules of the layers below its
//! own, never one of its own layer or above, so no two modules depend on
//! each other (`raft`'s modules are placed one by one, since the watch hub
//! sits between the state-machine store that feeds it and consensus).
//! Lowest first:
//!
//! 1. `sync`, `private_fs`, `certs`, `raft::runtime`, `raft::peer_token`, `raft::write_behind`, `raft::gradual_release`
//! 2. `raft::snapshot_file`
//! 3. `clock`, `login_guard`, `raft::type_config`, `raft::storage_failure`
//! 4. `tls`, `identity`, `transport`, `raft::write_error`, `raft::segment_log`, `raft::commit_notice`
//! 5. `watch`, `raft::peer_checks`, `raft::network`
//! 6. `raft::state_machine_store`
//! 7. `raft::peer_service`, `raft::seed`
//! 8. `raft::consensus`, `backup`
//! 9. `auth`
//! 10. `node`
//! 11. `grpc`, `telemetry`
//! 12. `server`
//!
//! `tests/tidy.rs` reads this list and fails on a use (`crate::...`,
//! `super::...`) of a module of the same or a higher layer, and on a
//! module the list leaves out.

pub mod auth;
pub mod backup;
pub mod certs;
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
