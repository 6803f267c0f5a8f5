//! Consensus: the only module that names openraft. Type configuration,
//! durable log store, state-machine store and peer network.

pub mod consensus;
pub mod network;
pub mod peer_service;
pub mod segment_log;
pub mod state_machine_store;
pub mod type_config;
