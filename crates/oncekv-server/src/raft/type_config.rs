//! The openraft type configuration of oncekv: what a log entry carries
//! (the state crate's [`Proposal`]: a request stamped with cluster time,
//! shared, so that reading an entry back for apply or replication copies
//! none of its bytes; the log and the wire encode the proposal alone),
//! what applying it answers ([`Applied`]), and how a node is addressed
//! ([`NodeInfo`]).

use oncekv_state::{LogIndex, Outcome, Proposal};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A node's id in the cluster.
pub type NodeId = u64;

/// Where a node listens: for its peers and for clients.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// `host:port` of the peer (Raft) service.
    pub peer_address: String,
    /// `host:port` clients are told to use (leader hints).
    pub client_address: String,
}

impl fmt::Display for NodeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "peer={} client={}",
            self.peer_address, self.client_address
        )
    }
}

/// What applying an entry answered, as openraft hands it back: an entry
/// without a request (a leader's blank entry or a membership change) has
/// no outcome. [`Executed`] is what a proposal's caller gets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The entry's index.
    pub index: LogIndex,
    /// What the state machine decided, for an entry with a request.
    pub outcome: Option<Outcome>,
}

/// A proposal's result: where it was applied and what the state machine
/// decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Executed {
    /// The entry's index.
    pub index: LogIndex,
    /// What the state machine decided.
    pub outcome: Outcome,
}

openraft::declare_raft_types!(
    /// oncekv's Raft types.
    pub TypeConfig:
        D = std::sync::Arc<Proposal>,
        R = Applied,
        NodeId = NodeId,
        Node = NodeInfo,
        AsyncRuntime = super::runtime::RaftRuntime,
);
