//! [`PeerMessageRefused`]: what the peer service refuses before openraft
//! sees it. openraft asserts (and, for some properties, only in debug
//! builds) what a protocol-following peer always sends; a forged or broken
//! message that breaks one would crash the node. These checks refuse such a
//! message instead, with INVALID_ARGUMENT: a term far ahead of the one this
//! node knows ([`check_term`]), an `AppendEntries` must carry a committed
//! vote of another node, entries that follow its `prev_log_id` one index at
//! a time, and no entry of a later leader than the vote; a snapshot must be
//! of a committed vote, hold no log id beyond that vote, and not contradict
//! what this node has committed. A refused message never reaches openraft,
//! so it changes nothing this node stores (its vote, its log).
//!
//! These checks judge what a message says, not who sent it: a well-formed
//! forgery passes them. Peers are authenticated before any of this, by a
//! shared cluster secret (`--peer-token-file`, checked on every call's
//! headers before its body is read: [`super::peer_token`]), by mutual TLS
//! (below), or both; `oncekv serve` refuses to start a node of several
//! without one of them unless told `--insecure-peers`. There, the term rule
//! is defence in depth: see [`TERM_AHEAD_MAX`].
//!
//! [`PeerNotAllowed`]: who may send at all, answered PERMISSION_DENIED. A
//! message's sender (the node id of the vote it carries: the candidate of
//! a vote request, the leader of an append, a snapshot or a leadership
//! transfer) must be in this node's effective membership (voters and
//! learners of the latest membership it knows, committed or not), unless
//! it knows none yet (a fresh node waiting to be added), or the message is
//! an append or a snapshot under a vote at least this node's own (a leader
//! that joined after the membership this node knows: [`check_leader`]). With peer TLS,
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
    /// A term no cluster reaches: counting on from it could overflow
    /// ([`TERM_LIMIT`]).
    #[error("term {0} is beyond the largest term a message may carry ({TERM_LIMIT})")]
    TermTooLarge(u64),
    /// A term further ahead of this node's own than elections ever take a
    /// cluster ([`TERM_AHEAD_MAX`]).
    #[error(
        "term {term} is implausibly far ahead of this node's term {known} (at most {TERM_AHEAD_MAX} ahead)"
    )]
    TermTooFarAhead {
        /// The message's term.
        term: u64,
        /// This node's current term (of the vote it stores).
        known: u64,
    },
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

/// Checks the sender of what only a leader sends (an append, a snapshot):
/// a member, as [`check_member`] says, or a leader whose vote is at least
/// the one this node stores.
///
/// The membership a node knows can be older than its leader. A new member
/// that installed a snapshot taken before the leader itself joined knows
/// only the members of then, and learns the rest from the leader's
/// entries after the snapshot: refusing them, it would never catch up.
/// Raft's own rule then judges the message, as for any leader: a vote at
/// least this node's is the current leader's (a vote is committed only by a
/// quorum, and a node outside the membership its peers know gets no vote
/// from them: [`check_member`] guards votes). A removed node that still
/// thinks it leads sends under an older vote, and is refused here.
pub fn check_leader(
    sender: NodeId,
    vote: &VoteOf<TypeConfig>,
    metrics: &RaftMetrics<TypeConfig>,
) -> Result<(), PeerNotAllowed> {
    match check_member(sender, &metrics.membership_config) {
        Err(_) if vote >= &metrics.vote => Ok(()),
        checked => checked,
    }
}

/// The node a vote names: the candidate of a vote request, the leader of
/// an append, a snapshot or a leadership transfer.
pub fn sender(vote: &VoteOf<TypeConfig>) -> NodeId {
    *vote.leader_id().node_id()
}

/// How far ahead of this node's current term (the term of the vote it
/// stores) a message's term may be: 2^32.
///
/// Honest nodes never get that far apart. A term grows by one per
/// election, and a node that lags behind its peers (partitioned, stopped,
/// restored) learns the higher term from the replies to its own pre-votes
/// and votes, which are not judged here; 2^32 elections are over a century
/// of one election a second. Only a forgery gets further ahead, and it
/// used to be accepted: a vote request of term 2^63 - 1 claiming a member,
/// granted and stored, left every later election beyond the old absolute
/// ceiling, so the cluster never elected a leader again, across restarts.
/// Judged relative to what this node knows, such a message is refused,
/// changes nothing, and an honest election at the next term still wins.
///
/// This is defence in depth, not authentication. Peers are authenticated
/// by the peer token or TLS, and an attacker without either cannot send
/// at all. With `--insecure-peers`, a forgery within the bound is still
/// accepted and can raise a node's term by up to 2^32 per message, so
/// reaching [`TERM_LIMIT`] takes about 2^32 accepted forgeries; what the
/// bound guarantees is that no single message, and no message that is
/// refused, can push a node there.
pub const TERM_AHEAD_MAX: u64 = 1 << 32;

/// The largest term a message may carry whatever this node knows: room is
/// left above it (2^33) for the elections counted on from any accepted
/// term, so terms never overflow. A message is refused before it is
/// stored, so no refused message brings a node nearer to it.
pub const TERM_LIMIT: u64 = u64::MAX - (1 << 33);

/// Checks a vote's term (any vote request, or the vote an append, a
/// snapshot or a leadership transfer is sent under) against `known`, the
/// term of the vote this node stores: at most [`TERM_AHEAD_MAX`] ahead of
/// it, and at most [`TERM_LIMIT`]. A term at or below `known` is not
/// refused here (openraft answers a stale one with its own vote).
pub fn check_term(vote: &VoteOf<TypeConfig>, known: u64) -> Result<(), PeerMessageRefused> {
    let term = vote.leader_id().term();
    if term > TERM_LIMIT {
        return Err(PeerMessageRefused::TermTooLarge(term));
    }
    if term > known.saturating_add(TERM_AHEAD_MAX) {
        return Err(PeerMessageRefused::TermTooFarAhead { term, known });
    }
    Ok(())
}

/// The term of the vote `metrics` says this node stores.
pub fn known_term(metrics: &RaftMetrics<TypeConfig>) -> u64 {
    metrics.vote.leader_id().term()
}

fn committed_vote(
    vote: &VoteOf<TypeConfig>,
    me: NodeId,
    known: u64,
) -> Result<(), PeerMessageRefused> {
    check_term(vote, known)?;
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

/// Checks an `AppendEntries` for node `me`, whose current term is `known`
/// and whose log is committed up to `committed`.
pub fn check_append(
    request: &AppendEntriesRequest<TypeConfig>,
    me: NodeId,
    known: u64,
    committed: Option<&LogIdOf<TypeConfig>>,
) -> Result<(), PeerMessageRefused> {
    committed_vote(&request.vote, me, known)?;
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

/// What an admitted `AppendEntries` makes committed once openraft takes
/// it: its leader's commit, or the last log id it carries if that is
/// earlier (a follower commits no further than the log it holds). An
/// honest leader's is committed cluster-wide, so no later honest message
/// contradicts it.
///
/// Appends are admitted as they are read, ahead of openraft taking the
/// earlier ones of a stream (or a concurrent call's), so this node's
/// committed log id read when one is admitted may not yet count what the
/// ones before it commit; the peer service checks each against the
/// greatest of both.
pub fn committed_by(request: &AppendEntriesRequest<TypeConfig>) -> Option<LogIdOf<TypeConfig>> {
    let last = request
        .entries
        .last()
        .map(|entry| entry.log_id)
        .or(request.prev_log_id)?;
    let commit = request.leader_commit?;
    Some(if commit.index() <= last.index() {
        commit
    } else {
        last
    })
}

/// Checks a snapshot sent under `vote` and ending at `last` for node `me`,
/// against the term and the committed log `metrics` give for this node.
pub fn check_snapshot(
    vote: &VoteOf<TypeConfig>,
    last: Option<&LogIdOf<TypeConfig>>,
    me: NodeId,
    metrics: &RaftMetrics<TypeConfig>,
) -> Result<(), PeerMessageRefused> {
    committed_vote(vote, me, known_term(metrics))?;
    let Some(last) = last else { return Ok(()) };
    within_vote(last, vote)?;
    agrees_with_committed(last, metrics.local_committed.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORGED: u64 = (1 << 63) - 1;

    /// A node's stored term as the peer service and openraft move it: a
    /// vote request refused here never reaches openraft and changes
    /// nothing; one admitted raises the stored term to its own (granted,
    /// for a candidate whose log is up to date).
    struct Node {
        term: u64,
    }

    impl Node {
        fn vote_request(&mut self, term: u64, candidate: NodeId) -> Result<(), PeerMessageRefused> {
            check_term(&VoteOf::<TypeConfig>::new(term, candidate), self.term)?;
            self.term = self.term.max(term);
            Ok(())
        }
    }

    #[test]
    fn a_forged_term_of_2_pow_63_is_refused_and_the_next_honest_election_wins() {
        let mut node = Node { term: 5 };
        assert_eq!(
            node.vote_request(FORGED, 2),
            Err(PeerMessageRefused::TermTooFarAhead {
                term: FORGED,
                known: 5
            })
        );
        assert_eq!(node.term, 5, "a refused message changes nothing");
        // However often it is sent.
        for _ in 0..1_000 {
            assert!(node.vote_request(FORGED, 2).is_err());
        }
        assert_eq!(node.term, 5);
        // An honest candidate of the next term is admitted, and the next.
        assert_eq!(node.vote_request(6, 3), Ok(()));
        assert_eq!(node.term, 6);
        assert_eq!(node.vote_request(7, 2), Ok(()));
        // So is a term behind this node's (openraft answers it with its
        // own vote).
        assert_eq!(node.vote_request(1, 3), Ok(()));
        assert_eq!(node.term, 7);
    }

    #[test]
    fn terms_are_judged_relative_to_the_known_one_and_never_near_overflow() {
        let vote = |term| VoteOf::<TypeConfig>::new(term, 2);
        assert_eq!(check_term(&vote(5 + TERM_AHEAD_MAX), 5), Ok(()));
        assert!(matches!(
            check_term(&vote(6 + TERM_AHEAD_MAX), 5),
            Err(PeerMessageRefused::TermTooFarAhead { .. })
        ));
        // A fresh node (term 0) takes any leader an honest cluster has.
        assert_eq!(check_term(&vote(1_000_000), 0), Ok(()));
        // A node that stored a forged term under the old absolute ceiling
        // (u64::MAX / 2) elects again: the next term is admitted.
        assert_eq!(check_term(&vote(FORGED + 1), FORGED), Ok(()));
        // Near the top, the absolute limit holds whatever is known, and
        // leaves room to count on.
        assert_eq!(check_term(&vote(TERM_LIMIT), TERM_LIMIT - 1), Ok(()));
        for (term, known) in [
            (TERM_LIMIT + 1, TERM_LIMIT),
            (u64::MAX, TERM_LIMIT),
            (u64::MAX, u64::MAX),
        ] {
            assert_eq!(
                check_term(&vote(term), known),
                Err(PeerMessageRefused::TermTooLarge(term))
            );
        }
        const { assert!(TERM_LIMIT.checked_add(2 * TERM_AHEAD_MAX).is_some()) };
    }

    #[test]
    fn an_append_under_a_vote_far_ahead_is_refused() {
        let append = |term| AppendEntriesRequest::<TypeConfig> {
            vote: VoteOf::<TypeConfig>::new_committed(term, 2),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        };
        assert_eq!(check_append(&append(4), 1, 3, None), Ok(()));
        assert!(matches!(
            check_append(&append(FORGED), 1, 3, None),
            Err(PeerMessageRefused::TermTooFarAhead { .. })
        ));
    }

    /// Node 3 installed a snapshot taken when the members were 1 and 2,
    /// and follows node 4 (term 5), which joined after it: node 4's appends
    /// and snapshots are admitted, as are those of a later leader; a
    /// non-member under an older vote is refused.
    #[test]
    fn a_leader_that_joined_after_the_known_membership_is_admitted_and_no_one_else() {
        use super::super::type_config::NodeInfo;
        use openraft::Membership;
        use openraft::vote::RaftLeaderIdExt;
        let mut metrics = RaftMetrics::<TypeConfig>::new_initial(3);
        let members: std::collections::BTreeMap<NodeId, NodeInfo> =
            [(1, NodeInfo::default()), (2, NodeInfo::default())].into();
        let membership =
            Membership::new(vec![members.keys().copied().collect()], members).expect("membership");
        let log_id = LogIdOf::<TypeConfig>::new(
            <TypeConfig as openraft::RaftTypeConfig>::LeaderId::new_committed(2, 1),
            40,
        );
        metrics.membership_config = std::sync::Arc::new(StoredMembershipOf::<TypeConfig>::new(
            Some(log_id),
            membership,
        ));
        metrics.vote = VoteOf::<TypeConfig>::new_committed(5, 4);
        let leader = |term, id| VoteOf::<TypeConfig>::new_committed(term, id);
        assert_eq!(check_leader(4, &leader(5, 4), &metrics), Ok(()));
        assert_eq!(check_leader(5, &leader(6, 5), &metrics), Ok(()));
        assert_eq!(check_leader(1, &leader(2, 1), &metrics), Ok(()), "a member");
        for (term, id) in [(4, 6), (4, 9), (1, 5)] {
            assert!(matches!(
                check_leader(id, &leader(term, id), &metrics),
                Err(PeerNotAllowed::NotAMember { sender, .. }) if sender == id
            ));
        }
        assert!(check_member(4, &metrics.membership_config).is_err());
    }

    /// A stream's appends commit what their leader commits, up to the log
    /// they carry; a later one that rewrites it is refused even before
    /// this node's own committed log id counts it.
    #[test]
    fn an_append_that_contradicts_what_an_earlier_one_commits_is_refused() {
        use openraft::entry::RaftEntry as _;
        use openraft::vote::RaftLeaderIdExt as _;
        let id = |term, index| {
            LogIdOf::<TypeConfig>::new(
                <TypeConfig as openraft::RaftTypeConfig>::LeaderId::new_committed(term, 2),
                index,
            )
        };
        let append =
            |term, prev: Option<u64>, indexes: &[u64], commit: Option<u64>| AppendEntriesRequest::<
                TypeConfig,
            > {
                vote: VoteOf::<TypeConfig>::new_committed(term, 2),
                prev_log_id: prev.map(|index| id(term, index)),
                entries: indexes
                    .iter()
                    .map(|&index| {
                        openraft::alias::EntryOf::<TypeConfig>::new_blank(id(term, index))
                    })
                    .collect(),
                leader_commit: commit.map(|index| id(term, index)),
            };
        // The leader's commit, or the last entry carried if earlier.
        assert_eq!(
            committed_by(&append(1, None, &[0, 1, 2], Some(1))),
            Some(id(1, 1))
        );
        assert_eq!(
            committed_by(&append(1, None, &[0, 1, 2], Some(7))),
            Some(id(1, 2))
        );
        assert_eq!(
            committed_by(&append(1, Some(4), &[], Some(9))),
            Some(id(1, 4))
        );
        assert_eq!(committed_by(&append(1, None, &[0], None)), None);
        assert_eq!(committed_by(&append(1, None, &[], Some(3))), None);
        let first = append(1, None, &[0, 1, 2], Some(2));
        let rewrite = append(2, Some(1), &[2], None);
        // Alone, nothing committed yet: admitted; after the first, refused.
        assert_eq!(check_append(&rewrite, 1, 1, None), Ok(()));
        assert!(matches!(
            check_append(&rewrite, 1, 1, committed_by(&first).as_ref()),
            Err(PeerMessageRefused::ContradictsCommitted { .. })
        ));
        // What follows the first honestly is admitted.
        let next = append(1, Some(2), &[3], Some(3));
        assert_eq!(
            check_append(&next, 1, 1, committed_by(&first).as_ref()),
            Ok(())
        );
    }
}
