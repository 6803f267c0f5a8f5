//! Consensus: the only module that names openraft. Type configuration,
//! durable log store, state-machine store, peer network and the runtime
//! openraft runs on.

pub mod commit_notice;
pub mod consensus;
pub mod gradual_release;
pub mod network;
pub mod peer_checks;
pub mod peer_service;
pub mod peer_token;
pub mod runtime;
pub mod seed;
pub mod segment_log;
pub mod snapshot_file;
pub mod state_machine_store;
pub mod storage_failure;
pub mod type_config;
pub mod write_behind;
pub mod write_error;
