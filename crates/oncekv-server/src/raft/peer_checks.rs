//! [`PeerMessageRefused`]: what the peer service refuses before openraft
//! sees it. openraft asserts (and, for some properties, only in debug
//! builds) what a protocol-following peer always sends; a forged or broken
//! message that breaks one would crash the node. These checks refuse such a
//! message instead, with INVALID_ARGUMENT: an `AppendEntries` must carry a
//! committed vote of another node, entries that follow its `prev_log_id`
//! one index at a time, and no entry of a later leader than the vote; a
//! snapshot must be of a committed vote, hold no log id beyond that vote,
//! and not contradict what this node has committed. (Only authenticating
//! peers stops a well-formed forgery: that is mutual TLS.)
//!
//! [`PeerNotAllowed`]: who may send at all, answered PERMISSION_DENIED. A
//! message's sender (the node id of the vote it carries: the candidate of
//! a vote request, the leader of an append, a snapshot or a leadership
//! transfer) must be in this node's effective membership (voters and
//! learners of the latest membership it knows, committed or not), unless
//! it knows none yet (a fresh node waiting to be added). With peer TLS,
//! the caller's verified certificate must also be valid for
//! `node-<sender>` ([`crate::tls`]), so a node cannot speak for another.

use super::type_config::{NodeId, TypeConfig};
use openraft::RaftMetrics;
use openraft::alias::{LogIdOf, StoredMembershipOf, VoteOf};
use openraft::raft::AppendEntriesRequest;
use openraft::vote::RaftLeaderId;

/// Why a peer message is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PeerMessageRefused {
    /// A term no cluster reaches (it would overflow when counted on).
    #[error("term {0} is implausibly far ahead")]
    TermTooLarge(u64),
    /// Its vote is not committed: no leader replicates under such a vote.
    #[error("the vote {0} is not committed: only a leader replicates")]
    UncommittedVote(String),
    /// Its vote names this node: a message from another node configured
    /// with this node's id, or a forgery.
    #[error("the vote {0} names this node as the leader")]
    FromItself(String),
    /// An entry is not at the index after the one before it.
    #[error("entry at index {found} where index {expected} was due")]
    OutOfOrder {
        /// Its index.
        found: u64,
        /// The index due.
        expected: u64,
    },
    /// An index that overflows.
    #[error("log index overflow after {0}")]
    IndexOverflow(u64),
    /// An entry (or a snapshot's last entry) of a later leader than the
    /// vote it is sent under.
    #[error("log id {log_id} is beyond the vote {vote} it is sent under")]
    BeyondVote {
        /// The log id.
        log_id: String,
        /// The vote.
        vote: String,
    },
    /// Entries whose leaders go back in time.
    #[error("entry {0} is of an earlier leader than the entry before it")]
    LeaderGoesBack(String),
    /// An entry, or a snapshot's last entry, of a later leader than this
    /// node's committed log at an index it has committed: it rewrites
    /// committed history.
    #[error("log id {received} contradicts the committed log ending at {committed}")]
    ContradictsCommitted {
        /// The log id received.
        received: String,
        /// This node's committed log id.
        committed: String,
    },
}

/// Why a peer may not send a message at all (PERMISSION_DENIED).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PeerNotAllowed {
    /// The sender is not in this node's membership.
    #[error("node {sender} is not a member of this node's cluster (members: {members:?})")]
    NotAMember {
        /// The sender id in the message.
        sender: NodeId,
        /// The members this node knows.
        members: Vec<NodeId>,
    },
    /// Peer TLS is on, but the caller presented no verified certificate.
    #[error("the message is from node {sender}, but the caller presented no verified certificate")]
    NoCertificate {
        /// The sender id in the message.
        sender: NodeId,
    },
    /// The caller's certificate is not for the node the message says it is
    /// from.
    #[error(
        "the message is from node {sender}, but the caller's certificate is not valid for {expected} (it names {names:?})"
    )]
    WrongCertificate {
        /// The sender id in the message.
        sender: NodeId,
        /// The name the certificate must carry.
        expected: String,
        /// The DNS names it carries.
        names: Vec<String>,
    },
}

/// Checks that `sender` is in `membership` (voters and learners, of every
/// configuration of a joint one), or that `membership` is empty: a node
/// that knows no membership yet is waiting to be added, and learns it from
/// the leader's first messages.
pub fn check_member(
    sender: NodeId,
    membership: &StoredMembershipOf<TypeConfig>,
) -> Result<(), PeerNotAllowed> {
    let members: Vec<NodeId> = membership.membership().nodes().map(|(id, _)| *id).collect();
    if members.is_empty() || members.contains(&sender) {
        return Ok(());
    }
    Err(PeerNotAllowed::NotAMember { sender, members })
}

/// The node a vote names: the candidate of a vote request, the leader of
/// an append, a snapshot or a leadership transfer.
pub fn sender(vote: &VoteOf<TypeConfig>) -> NodeId {
    *vote.leader_id().node_id()
}

/// The largest term a message may carry: a cluster that elected a leader
/// every millisecond would take millions of years to reach it, and counting
/// on from it never overflows.
pub const TERM_MAX: u64 = u64::MAX / 2;

/// Checks a vote's term (any vote request or vote a message carries).
pub fn check_term(vote: &VoteOf<TypeConfig>) -> Result<(), PeerMessageRefused> {
    let term = vote.leader_id().term();
    if term > TERM_MAX {
        return Err(PeerMessageRefused::TermTooLarge(term));
    }
    Ok(())
}

fn committed_vote(vote: &VoteOf<TypeConfig>, me: NodeId) -> Result<(), PeerMessageRefused> {
    check_term(vote)?;
    if !vote.is_committed() {
        return Err(PeerMessageRefused::UncommittedVote(vote.to_string()));
    }
    if *vote.leader_id().node_id() == me {
        return Err(PeerMessageRefused::FromItself(vote.to_string()));
    }
    Ok(())
}

fn within_vote(
    log_id: &LogIdOf<TypeConfig>,
    vote: &VoteOf<TypeConfig>,
) -> Result<(), PeerMessageRefused> {
    if *log_id.committed_leader_id() > vote.leader_id().to_committed() {
        return Err(PeerMessageRefused::BeyondVote {
            log_id: log_id.to_string(),
            vote: vote.to_string(),
        });
    }
    Ok(())
}

/// A log id at an index this node has committed must be the committed one
/// or an earlier one: a later leader's entry there rewrites committed history.
fn agrees_with_committed(
    log_id: &LogIdOf<TypeConfig>,
    committed: Option<&LogIdOf<TypeConfig>>,
) -> Result<(), PeerMessageRefused> {
    match committed {
        Some(committed) if log_id.index() <= committed.index() && log_id > committed => {
            Err(PeerMessageRefused::ContradictsCommitted {
                received: log_id.to_string(),
                committed: committed.to_string(),
            })
        }
        _ => Ok(()),
    }
}

/// Checks an `AppendEntries` for node `me`, whose log is committed up to
/// `committed`.
pub fn check_append(
    request: &AppendEntriesRequest<TypeConfig>,
    me: NodeId,
    committed: Option<&LogIdOf<TypeConfig>>,
) -> Result<(), PeerMessageRefused> {
    committed_vote(&request.vote, me)?;
    let mut expected = match &request.prev_log_id {
        None => 0,
        Some(prev) => {
            within_vote(prev, &request.vote)?;
            agrees_with_committed(prev, committed)?;
            prev.index()
                .checked_add(1)
                .ok_or(PeerMessageRefused::IndexOverflow(prev.index()))?
        }
    };
    let mut previous = request.prev_log_id;
    for entry in &request.entries {
        let log_id = &entry.log_id;
        if log_id.index() != expected {
            return Err(PeerMessageRefused::OutOfOrder {
                found: log_id.index(),
                expected,
            });
        }
        within_vote(log_id, &request.vote)?;
        agrees_with_committed(log_id, committed)?;
        if previous
            .as_ref()
            .is_some_and(|before| before.committed_leader_id() > log_id.committed_leader_id())
        {
            return Err(PeerMessageRefused::LeaderGoesBack(log_id.to_string()));
        }
        expected = expected
            .checked_add(1)
            .ok_or(PeerMessageRefused::IndexOverflow(expected))?;
        previous = Some(*log_id);
    }
    Ok(())
}

/// Checks a snapshot sent under `vote` and ending at `last` for node `me`,
/// against what `metrics` says this node has committed.
pub fn check_snapshot(
    vote: &VoteOf<TypeConfig>,
    last: Option<&LogIdOf<TypeConfig>>,
    me: NodeId,
    metrics: &RaftMetrics<TypeConfig>,
) -> Result<(), PeerMessageRefused> {
    committed_vote(vote, me)?;
    let Some(last) = last else { return Ok(()) };
    within_vote(last, vote)?;
    agrees_with_committed(last, metrics.local_committed.as_ref())
}
