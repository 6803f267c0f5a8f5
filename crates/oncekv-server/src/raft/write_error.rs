//! [`WriteError`]: why a write or a read barrier did not complete, in the
//! node's own terms (no openraft type). [`super::consensus`] answers it
//! (and re-exports it); it sits below consensus so that what consensus
//! builds on (the watch hub of the applied state) can refuse with it too,
//! and each service maps it to its wire.

use super::type_config::{NodeId, NodeInfo};

/// Why a write or a read barrier did not complete.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// This node is not the leader; the leader, if known, is given. Given
    /// only when nothing was handed to openraft, or openraft refused it
    /// before appending (`ForwardToLeader`): clients take it for "not
    /// proposed". What each answer promises on the wire is tabled in
    /// `grpc::kv_service`.
    #[error("not the leader")]
    NotLeader {
        /// The leader's id, if known.
        leader_id: Option<NodeId>,
        /// The leader's addresses, if known.
        leader: Option<NodeInfo>,
    },
    /// Consensus cannot serve now (shutting down, no quorum, storage
    /// failure), or the outcome is unknown: the request may have been
    /// proposed and may still apply. The answer whenever the node cannot
    /// know.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Refused before proposing: whatever the state, the state machine
    /// would refuse it. Not applied.
    #[error("invalid request: {0}")]
    Invalid(#[from] oncekv_state::InvalidRequest),
    /// Refused before proposing because the node is shedding this kind of
    /// request (named); not applied, retry later.
    #[error("overloaded: {0}")]
    Overloaded(&'static str),
    /// Authentication is enforced and the call named no valid user; not
    /// applied.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The call's user may not do this; not applied.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// Refused before anything was proposed, for the reason given.
    #[error("refused: {0}")]
    Refused(String),
}
