//! [`Consensus`]: the node's handle on openraft, in the node's own terms.
//! Writes a [`Proposal`] and returns what applying it decided ([`Executed`]), waits for a
//! read barrier (a leader lease, or read-index: [`ReadPolicy`]), reports leadership and
//! status, and changes membership. Everything outside `raft/` talks to consensus through it.
//! Its answer when a write or read fails is [`WriteError`] (from [`super::write_error`]).

use super::peer_service::LeaderContact;
use super::state_machine_store::{
    PeerProgress, Raft, SharedState, SnapshotDeferral, StateMachineStore,
};
use super::type_config::{Applied, Executed, NodeId, NodeInfo, TypeConfig};
pub use super::write_error::WriteError;
use oncekv_state::Proposal;
use openraft::LinearizerOption;
use openraft::alias::LogIdOf;
use openraft::error::{
    ChangeMembershipError, ClientWriteError, InitializeError, PreconditionFailed, RaftError,
};
use openraft::errors::LinearizableReadError;
use openraft::storage::RaftLogStorage;
use openraft::{
    ChangeMembers, Config, Precondition, RaftNetworkFactory, ServerState, SnapshotPolicy,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// How the leader confirms, for a linearizable read, that it still leads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadPolicy {
    /// Within its lease, the leader answers from its applied state with no
    /// message to the followers; past it, it falls back to read-index.
    ///
    /// The lease is [`LEASE_PERCENT_OF_ELECTION_TIMEOUT`] percent of the
    /// maximum election timeout, counted on the leader's monotonic clock
    /// from the sending of the last heartbeat or append a quorum
    /// acknowledged. A follower refuses to vote for anyone for a whole
    /// maximum election timeout, counted on its own clock from receiving
    /// that message (and a restarted node for one after it starts), so no
    /// other leader can be elected while the lease holds as long as no
    /// clock runs more than about 5% faster or slower than another's.
    #[default]
    Lease,
    /// Every read waits for a quorum to acknowledge a heartbeat sent after
    /// it arrived (concurrent reads share the round); no clock assumption.
    ReadIndex,
}

/// The leader lease, as a percentage of the maximum election timeout: with
/// clocks whose rates differ by at most a factor `1 ± r`, the lease is safe
/// while `(1 - r) / (1 + r) >= 0.9`, i.e. `r` up to about 5% (quartz
/// clocks, and NTP's slewing, stay well under 0.1%).
pub const LEASE_PERCENT_OF_ELECTION_TIMEOUT: u64 = 90;

/// How often [`Consensus::stopped_fatally`] looks whether consensus has
/// stopped: how long a node that cannot go on lingers before it stops.
pub const FATAL_STOP_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

impl ReadPolicy {
    /// The lease a leader reads under, for `election_timeout_max_ms`.
    pub fn lease(election_timeout_max_ms: u64) -> Duration {
        Duration::from_millis(
            election_timeout_max_ms.saturating_mul(LEASE_PERCENT_OF_ELECTION_TIMEOUT) / 100,
        )
    }
}

/// Timing and snapshot settings of consensus.
#[derive(Clone, Debug)]
pub struct ConsensusOptions {
    /// Heartbeat interval, in milliseconds.
    pub heartbeat_ms: u64,
    /// Lower bound of the randomised election timeout, in milliseconds.
    pub election_timeout_min_ms: u64,
    /// Upper bound of the randomised election timeout, in milliseconds.
    pub election_timeout_max_ms: u64,
    /// Take a snapshot after this many entries since the last one
    /// (100,000 by default, etcd's `--snapshot-count`: every snapshot
    /// encodes and writes the whole state, history included, so a small
    /// threshold spends the disk and the CPU on snapshots).
    pub snapshot_after_entries: u64,
    /// Take a snapshot once this many bytes of keys and values were applied
    /// since the last one (checked every tick), so a log of large values is
    /// compacted as soon as one of many small ones.
    pub snapshot_after_bytes: u64,
    /// Entries kept in the log behind a snapshot (for slow followers).
    pub log_entries_kept_after_snapshot: u64,
    /// How a linearizable read confirms leadership.
    pub read_policy: ReadPolicy,
    /// How the leader sends entries to followers.
    pub peer_append: super::network::PeerAppend,
}

impl Default for ConsensusOptions {
    fn default() -> Self {
        ConsensusOptions {
            heartbeat_ms: 100,
            election_timeout_min_ms: 500,
            election_timeout_max_ms: 1000,
            snapshot_after_entries: 100_000,
            snapshot_after_bytes: 64 * 1024 * 1024,
            log_entries_kept_after_snapshot: 1_000,
            read_policy: ReadPolicy::default(),
            peer_append: super::network::PeerAppend::default(),
        }
    }
}

/// Why consensus could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is invalid.
    #[error("invalid consensus configuration: {0}")]
    Config(String),
    /// Storage could not be opened.
    #[error("storage: {0}")]
    Storage(#[from] std::io::Error),
    /// openraft refused to start.
    #[error("consensus failed to start: {0}")]
    Raft(String),
}

/// Who leads, as this node sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leadership {
    /// The current term.
    pub term: u64,
    /// The leader, if known.
    pub leader_id: Option<NodeId>,
    /// Whether this node is the leader.
    pub is_leader: bool,
}

/// One member of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberStatus {
    /// Its id.
    pub id: NodeId,
    /// Its addresses.
    pub info: NodeInfo,
    /// Whether it votes (otherwise a learner).
    pub voter: bool,
}

/// Consensus progress, for status and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaftStatus {
    /// This node's id.
    pub id: NodeId,
    /// Leadership as seen here.
    pub leadership: Leadership,
    /// Index of the last log entry.
    pub last_log_index: Option<u64>,
    /// Index of the last committed entry.
    pub commit_index: Option<u64>,
    /// Index of the last applied entry.
    pub applied_index: Option<u64>,
    /// Index covered by the latest snapshot.
    pub snapshot_index: Option<u64>,
    /// The members.
    pub members: Vec<MemberStatus>,
    /// On the leader: each follower's last matched log index (`None` for
    /// nothing yet); empty elsewhere.
    pub replication: Vec<(NodeId, Option<u64>)>,
    /// On the leader: how many voters (itself included) acknowledged a
    /// heartbeat or an append within the longest election timeout, and how
    /// many voters there are; `None` elsewhere. A leader cut off from a
    /// quorum still calls itself leader (openraft has no check-quorum
    /// step-down) but cannot commit: this is how it knows.
    pub voters_heard: Option<(usize, usize)>,
}

/// Which membership a change was decided on: the log id of the entry
/// that stored it ([`Consensus::membership`]). A change guarded by it
/// ([`Consensus::change_member_if`]) is proposed only while that is still
/// the membership, so a change made in between is never overwritten.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MembershipVersion(Option<LogIdOf<TypeConfig>>);

/// The membership as this node sees it, read at one instant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipView {
    /// The members.
    pub members: Vec<MemberStatus>,
    /// Which membership this is.
    pub version: MembershipVersion,
    /// This node's last log index.
    pub last_log_index: Option<u64>,
    /// On the leader: itself and the members that acknowledged a heartbeat
    /// or an append within the last maximum election timeout (those that
    /// are running and reachable); `None` elsewhere.
    pub reachable: Option<BTreeSet<NodeId>>,
}

/// A change of one member, made by [`Consensus::change_member_if`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberChange {
    /// Adds a learner, without waiting for it to run or catch up (one
    /// entry).
    AddLearner {
        /// Its id.
        id: NodeId,
        /// Its addresses.
        info: NodeInfo,
    },
    /// Makes a learner a voter, without waiting for it to catch up (a
    /// joint entry, then a uniform one).
    Promote {
        /// Its id.
        id: NodeId,
    },
    /// Gives a member new addresses, keeping the voters and learners (one
    /// entry). A leader's running replication to it keeps the address it
    /// was started with: it dials the new one once restarted (a new
    /// leader, or the member removed and added again).
    SetAddresses {
        /// Its id.
        id: NodeId,
        /// Its new addresses.
        info: NodeInfo,
    },
    /// Removes a learner (one entry; a voter is refused).
    RemoveLearner {
        /// Its id.
        id: NodeId,
    },
}

/// Why a guarded membership change was not made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MemberChangeError {
    /// The membership is no longer the one the change was decided on, or
    /// another change is still being committed: nothing was proposed;
    /// decide again on the current membership.
    #[error(
        "the membership changed, or is changing, since the change was decided ({0}); nothing was proposed"
    )]
    Changed(String),
    /// The write failed as [`WriteError`] says.
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// The node's consensus engine.
#[derive(Clone)]
pub struct Consensus {
    id: NodeId,
    raft: Raft,
    state: SharedState,
    /// The directory of the state machine's snapshot file (where a
    /// backup is written before it is sent).
    state_dir: std::path::PathBuf,
    snapshot_after_bytes: u64,
    snapshot_after_entries: u64,
    read_policy: ReadPolicy,
    /// The lease of [`ReadPolicy::Lease`].
    read_lease: Duration,
    /// Until when this node refuses to vote (and does not campaign):
    /// restarted, it forgot whom it promised not to replace.
    votes_from: tokio::time::Instant,
    /// When the leader this node follows was last heard from.
    contact: LeaderContact,
    /// How long a follower names a leader it has not heard from: a
    /// maximum election timeout (then, with pre-vote, it would be asking
    /// for votes, which openraft's metrics do not show).
    leader_silence: Duration,
}

impl std::fmt::Debug for Consensus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consensus")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// What a refused write tells its caller.
fn client_write_error(error: ClientWriteError<TypeConfig>) -> WriteError {
    match error {
        // The entry was appended, then discarded by a leader change: it may
        // still commit through another leader, so the outcome is unknown.
        ClientWriteError::LogEntryDiscarded(_) => WriteError::Unavailable(error.to_string()),
        ClientWriteError::ForwardToLeader(forward) => WriteError::NotLeader {
            leader_id: forward.leader_id,
            leader: forward.leader_node,
        },
        other => WriteError::Unavailable(other.to_string()),
    }
}

/// What a failed membership write tells its caller, when it is the first
/// write of the change and a single entry: openraft answers
/// `ForwardToLeader` only before appending it.
fn write_error(error: RaftError<TypeConfig, ClientWriteError<TypeConfig>>) -> WriteError {
    match error {
        RaftError::APIError(error) => client_write_error(error),
        RaftError::Fatal(fatal) => WriteError::Unavailable(fatal.to_string()),
    }
}

/// What a failed membership write tells its caller once part of the
/// change may already be in the log: an earlier write of the change, or
/// the joint entry openraft appends before the uniform one of a voter
/// change (its `ForwardToLeader` may come from the second entry, after the
/// first committed). "Not the leader" would say nothing was proposed, so it
/// becomes "unavailable": the change may be partly made.
fn write_error_after_proposing(
    error: RaftError<TypeConfig, ClientWriteError<TypeConfig>>,
) -> WriteError {
    match write_error(error) {
        WriteError::NotLeader { leader_id, .. } => {
            let leader = leader_id.map_or_else(|| "none known".to_string(), |id| id.to_string());
            WriteError::Unavailable(format!(
                "this node stopped leading (leader: {leader}) during the membership change, \
                 after part of it may have been proposed: it may be partly made; read the members"
            ))
        }
        other => other,
    }
}

/// What applying a proposal's entry decided.
fn executed(applied: Applied) -> Result<Executed, WriteError> {
    match applied.outcome {
        Some(outcome) => Ok(Executed {
            index: applied.index,
            outcome,
        }),
        // A proposal's entry carries a request, so applying it always
        // decides an outcome; say "unknown" rather than guess.
        None => Err(WriteError::Unavailable(format!(
            "entry {} was applied without an outcome",
            applied.index.0
        ))),
    }
}

fn read_error(error: RaftError<TypeConfig, LinearizableReadError<TypeConfig>>) -> WriteError {
    match error.forward_to_leader() {
        Some(forward) => WriteError::NotLeader {
            leader_id: forward.leader_id,
            leader: forward.leader_node.clone(),
        },
        None => WriteError::Unavailable(error.to_string()),
    }
}

impl Consensus {
    /// Starts consensus for node `id` over `log_store` and `state_machine`,
    /// talking to peers through `network`. When `initial_members` is given
    /// and the node has no state yet, the cluster is initialised with them.
    pub async fn start<LS, N>(
        id: NodeId,
        options: &ConsensusOptions,
        log_store: LS,
        state_machine: StateMachineStore,
        network: N,
        initial_members: Option<BTreeMap<NodeId, NodeInfo>>,
    ) -> Result<Consensus, StartError>
    where
        LS: RaftLogStorage<TypeConfig>,
        N: RaftNetworkFactory<TypeConfig>,
        N::Network: openraft::network::NetSnapshot<
                TypeConfig,
                SnapshotData = super::snapshot_file::SnapshotFile,
            >,
    {
        let config = Config {
            cluster_name: "oncekv".into(),
            heartbeat_interval: options.heartbeat_ms,
            election_timeout_min: options.election_timeout_min_ms,
            election_timeout_max: options.election_timeout_max_ms,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(options.snapshot_after_entries),
            max_in_snapshot_log_to_keep: options.log_entries_kept_after_snapshot,
            // A node that led before a restart must win an election again:
            // restored at once, it would serve read-index reads before it
            // knows the commit index (reads could miss acknowledged writes).
            enable_leader_restore: Some(false),
            // Turned on below: at once on a new node, an election timeout
            // after start on a restarted one.
            enable_elect: false,
            // A node that stopped hearing its leader first asks whether a
            // quorum would elect it, and raises its term only then: a
            // member restarted or cut off for a while rejoins without
            // deposing a leader the others still follow.
            enable_pre_vote: Some(true),
            ..Config::default()
        }
        .validate()
        .map_err(|e| StartError::Config(e.to_string()))?;
        // A snapshot is put off while the current one is sent to a peer or
        // a peer catches up after it, up to four times the usual distance
        // between snapshots.
        let peers = Arc::new(std::sync::OnceLock::new());
        let state_machine = state_machine.with_snapshot_deferral(SnapshotDeferral {
            entries: options.snapshot_after_entries.saturating_mul(4),
            bytes: options.snapshot_after_bytes.saturating_mul(4),
            kept: options.log_entries_kept_after_snapshot,
            peers: Arc::clone(&peers),
        });
        let state = state_machine.shared();
        let state_dir = state_machine.dir().to_path_buf();
        let started = tokio::time::Instant::now();
        let raft = Raft::new(id, Arc::new(config), network, log_store, state_machine)
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;
        let metrics = raft.metrics();
        // Set once, here: the cell is new.
        let _ = peers.set(PeerProgress::new(move || {
            let metrics = openraft::async_runtime::WatchReceiver::borrow_watched(&metrics);
            metrics
                .replication
                .as_ref()
                .map_or_else(Vec::new, |replication| {
                    replication
                        .values()
                        .map(|matched| matched.as_ref().map(|id| id.index))
                        .collect()
                })
        }));
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;
        // A follower promises a leader, for an election timeout after each
        // of its messages, to vote for no one else; leader lease reads rely
        // on that promise, which lives in memory only. A restarted member
        // keeps it by neither voting nor campaigning for one maximum
        // election timeout after it starts.
        let votes_from = if initialized {
            started + Duration::from_millis(options.election_timeout_max_ms)
        } else {
            started
        };
        let elect = raft.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(votes_from).await;
            elect.runtime_config().elect(true);
        });
        if let Some(members) = initial_members
            && !initialized
        {
            match raft.initialize(members).await {
                Ok(()) => {}
                // Another member initialised the cluster first: fine.
                Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
                Err(error) => return Err(StartError::Raft(error.to_string())),
            }
        }
        Ok(Consensus {
            id,
            raft,
            state,
            state_dir,
            snapshot_after_bytes: options.snapshot_after_bytes.max(1),
            snapshot_after_entries: options.snapshot_after_entries.max(1),
            read_policy: options.read_policy,
            read_lease: ReadPolicy::lease(options.election_timeout_max_ms),
            votes_from,
            contact: LeaderContact::default(),
            leader_silence: Duration::from_millis(options.election_timeout_max_ms),
        })
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The limits the state machine enforces.
    pub fn limits(&self) -> oncekv_state::Limits {
        self.state.lock().machine.limits().clone()
    }

    /// The cluster time of the last applied entry.
    pub fn cluster_time(&self) -> oncekv_state::ClusterTime {
        self.state.lock().machine.cluster_time()
    }

    /// When the applied state next has something to expire
    /// ([`oncekv_state::StateMachine::next_expiry`]).
    pub fn next_expiry(&self) -> Option<oncekv_state::ClusterTime> {
        self.state.lock().machine.next_expiry()
    }

    /// Runs `f` on this replica's applied state, under its lock (keep it
    /// short: applies wait).
    pub fn with_state<R>(&self, f: impl FnOnce(&oncekv_state::StateMachine) -> R) -> R {
        f(&self.state.lock().machine)
    }

    /// Runs `f` on this replica's applied state and its watch hub, under
    /// the state's lock.
    pub fn with_state_and_watch(&self, f: crate::watch::Visit<'_>) {
        let state = self.state.lock();
        f(&state.machine, &state.watch)
    }

    /// The applied state's counts.
    pub fn stats(&self) -> oncekv_state::Stats {
        self.state.lock().machine.stats()
    }

    /// A copy of the applied state machine (the lock is held for the copy
    /// only).
    pub fn state_copy(&self) -> oncekv_state::StateMachine {
        self.state.lock().machine.clone()
    }

    /// The directory of the state machine's snapshot file.
    pub fn state_dir(&self) -> &std::path::Path {
        &self.state_dir
    }

    /// The peer service for this node's consensus.
    pub fn peer_service(&self) -> super::peer_service::PeerService {
        super::peer_service::PeerService::new(self.raft.clone())
            .with_votes_from(self.votes_from)
            .with_leader_contact(self.contact.clone())
    }

    /// Proposes `proposals` in one message to consensus, which appends
    /// them as consecutive log entries in one write, and calls `answer`
    /// with each proposal's position and what applying it decided here, in
    /// their order, each as soon as its entry is applied: exactly once per
    /// proposal.
    pub async fn write_many(
        &self,
        proposals: Vec<Proposal>,
        mut answer: impl FnMut(usize, Result<Executed, WriteError>),
    ) {
        use futures_util::StreamExt as _;
        let count = proposals.len();
        let mut answered = 0;
        let proposals = proposals.into_iter().map(std::sync::Arc::new);
        let stopped = match self.raft.client_write_many(proposals).await {
            Ok(mut results) => loop {
                match results.next().await {
                    Some(Ok(result)) if answered < count => {
                        let result = result
                            .map_err(client_write_error)
                            .and_then(|response| executed(response.response));
                        answer(answered, result);
                        answered += 1;
                    }
                    Some(Ok(_)) | None => break None,
                    Some(Err(fatal)) => break Some(fatal.to_string()),
                }
            },
            Err(fatal) => Some(fatal.to_string()),
        };
        // Consensus stopped: what was not answered may or may not have been
        // appended, so its outcome is unknown.
        let why = stopped.unwrap_or_else(|| "consensus stopped".to_string());
        for position in answered..count {
            answer(
                position,
                Err(WriteError::Unavailable(format!(
                    "{why}; it may still apply"
                ))),
            );
        }
    }

    /// Waits until this node, the leader, has applied everything committed
    /// before the call, so a read of local state is linearizable. Under
    /// [`ReadPolicy::Lease`], a valid lease confirms leadership at once;
    /// when openraft finds it stale (no quorum acknowledged a message sent
    /// within the lease), the read falls back to read-index.
    pub async fn read_barrier(&self) -> Result<(), WriteError> {
        if self.read_policy == ReadPolicy::Lease {
            // Fails at once, without waiting or sending, if the lease is stale.
            let lease = LinearizerOption::new(Some(self.read_lease), false)
                .with_wait_timeout(Duration::ZERO);
            match self.raft.ensure_linearizable(lease).await {
                Ok(_) => return Ok(()),
                Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(_))) => {}
                Err(error) => return Err(read_error(error)),
            }
        }
        self.raft
            .ensure_linearizable(openraft::ReadPolicy::ReadIndex)
            .await
            .map(drop)
            .map_err(read_error)
    }

    /// Resolves, with the cause, when consensus stops on a fatal error
    /// (a failed log write or sync, say). A node in that state can neither
    /// lead nor follow; it must stop, so that it restarts from its durable
    /// state instead of lingering half alive.
    ///
    /// Checked every [`FATAL_STOP_CHECK_INTERVAL`] rather than on every
    /// change of openraft's metrics: those change with every batch the
    /// node writes or applies, and a waiter on them would wake a thread
    /// that many times a second for a state that almost never comes.
    pub async fn stopped_fatally(&self) -> String {
        loop {
            if let Some(cause) = self.stopped() {
                return cause;
            }
            tokio::time::sleep(FATAL_STOP_CHECK_INTERVAL).await;
        }
    }

    /// Why consensus has stopped on this node (shut down, or stopped by a
    /// fatal error such as a failed log write), if it has.
    pub fn stopped(&self) -> Option<String> {
        let metrics = self.raft.metrics();
        let metrics = openraft::async_runtime::WatchReceiver::borrow_watched(&metrics);
        match &metrics.running_state {
            Err(fatal) => Some(fatal.to_string()),
            Ok(()) if metrics.state == ServerState::Shutdown => {
                Some("consensus shut down".to_string())
            }
            Ok(()) => None,
        }
    }

    /// This node's leadership if it leads; otherwise what to tell the
    /// caller of something only the leader carries out, decided before
    /// anything is handed to openraft: [`WriteError::NotLeader`] (the
    /// leader this node knows of, if any), or [`WriteError::Unavailable`]
    /// once consensus has stopped here. A stopped node's view of leadership
    /// froze when it stopped (it may name itself), so it sends no one
    /// anywhere.
    pub fn leading(&self) -> Result<Leadership, WriteError> {
        if let Some(why) = self.stopped() {
            return Err(WriteError::Unavailable(format!(
                "consensus has stopped on this node ({why}); it carries out no more writes"
            )));
        }
        let leadership = self.leadership();
        if leadership.is_leader {
            return Ok(leadership);
        }
        Err(WriteError::NotLeader {
            leader_id: leadership.leader_id,
            leader: leadership.leader_id.and_then(|id| self.member(id)),
        })
    }

    /// Leadership as this node sees it now.
    pub fn leadership(&self) -> Leadership {
        let metrics = self.raft.metrics();
        let metrics = openraft::async_runtime::WatchReceiver::borrow_watched(&metrics);
        self.heard_leadership(&metrics)
    }

    /// Leadership as `metrics` show it, but a follower names its leader
    /// only while it hears from it: openraft, with pre-vote, names the
    /// leader of the vote it stores until an election succeeds, however
    /// long ago that leader was heard from (cut off, or the leader gone
    /// with the quorum), where Raft without pre-vote, and etcd, would say
    /// there is none.
    fn heard_leadership(&self, metrics: &openraft::RaftMetrics<TypeConfig>) -> Leadership {
        let leader_id = metrics
            .current_leader
            .filter(|leader| *leader == self.id || self.contact.heard_within(self.leader_silence));
        Leadership {
            term: metrics.current_term,
            leader_id,
            is_leader: metrics.state == ServerState::Leader,
        }
    }

    /// The leader of the vote this node stores, heard from lately or not
    /// (openraft's view; [`Consensus::leadership`] names one only while it
    /// is heard from): where a call may still be forwarded when no leader
    /// is heard from.
    pub fn remembered_leader(&self) -> Option<NodeId> {
        let metrics = self.raft.metrics();
        let metrics = openraft::async_runtime::WatchReceiver::borrow_watched(&metrics);
        metrics.current_leader.filter(|leader| *leader != self.id)
    }

    /// The addresses of member `id`, if it is one.
    pub fn member(&self, id: NodeId) -> Option<NodeInfo> {
        let metrics = self.raft.metrics();
        let metrics = openraft::async_runtime::WatchReceiver::borrow_watched(&metrics);
        metrics
            .membership_config
            .membership()
            .get_node(&id)
            .cloned()
    }

    /// Consensus progress and membership.
    pub fn status(&self) -> RaftStatus {
        let metrics = self.raft.metrics();
        let metrics = openraft::async_runtime::WatchReceiver::borrow_watched(&metrics);
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, info)| MemberStatus {
                id: *id,
                info: info.clone(),
                voter: voters.contains(id),
            })
            .collect();
        let voters_heard = self.reachable_in(&metrics).map(|reachable| {
            let heard = voters.intersection(&reachable).count();
            (heard, voters.len())
        });
        RaftStatus {
            id: self.id,
            leadership: self.heard_leadership(&metrics),
            last_log_index: metrics.last_log_index,
            commit_index: metrics.local_committed.as_ref().map(|id| id.index),
            applied_index: metrics.last_applied.as_ref().map(|id| id.index),
            snapshot_index: metrics.snapshot.as_ref().map(|id| id.index),
            members,
            replication: metrics
                .replication
                .iter()
                .flatten()
                .filter(|(id, _)| **id != self.id)
                .map(|(id, matched)| (*id, matched.as_ref().map(|log_id| log_id.index)))
                .collect(),
            voters_heard,
        }
    }

    /// Adds a node: first as a learner (waiting until it caught up), then
    /// as a voter. Only a refusal before the learner's entry was appended
    /// is [`WriteError::NotLeader`]; a failure after it is
    /// [`WriteError::Unavailable`] (the node may be a learner already).
    pub async fn add_member(&self, id: NodeId, info: NodeInfo) -> Result<(), WriteError> {
        self.leading()?;
        self.wait_until_established().await;
        // One entry (a learner changes no quorum, so no joint step):
        // `ForwardToLeader` here means it was not appended.
        self.raft
            .add_learner(id, info, true)
            .await
            .map_err(write_error)?;
        let voters: BTreeSet<NodeId> = [id].into();
        self.raft
            .change_membership(ChangeMembers::AddVoterIds(voters), false)
            .await
            .map_err(write_error_after_proposing)?;
        Ok(())
    }

    /// Removes a node from the cluster. Only a refusal before anything was
    /// handed to openraft is [`WriteError::NotLeader`]: removing a voter
    /// is two entries (joint, then uniform), and openraft's
    /// `ForwardToLeader` does not say which of them it refused.
    pub async fn remove_member(&self, id: NodeId) -> Result<(), WriteError> {
        self.leading()?;
        self.wait_until_established().await;
        let ids: BTreeSet<NodeId> = [id].into();
        self.raft
            .change_membership(ChangeMembers::RemoveVoters(ids.clone()), false)
            .await
            .map_err(write_error_after_proposing)?;
        self.raft
            .change_membership(ChangeMembers::RemoveNodes(ids), false)
            .await
            .map_err(write_error_after_proposing)?;
        Ok(())
    }

    /// The membership, its version, this node's last log index and, on
    /// the leader, which members are reachable, read together.
    pub fn membership(&self) -> MembershipView {
        let metrics = self.raft.metrics();
        let metrics = openraft::async_runtime::WatchReceiver::borrow_watched(&metrics);
        let stored = &metrics.membership_config;
        let membership = stored.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, info)| MemberStatus {
                id: *id,
                info: info.clone(),
                voter: voters.contains(id),
            })
            .collect();
        let reachable = self.reachable_in(&metrics);
        MembershipView {
            members,
            version: MembershipVersion(*stored.log_id()),
            last_log_index: metrics.last_log_index,
            reachable,
        }
    }

    /// On the leader, the members that acknowledged a heartbeat within the
    /// longest election timeout, and itself; `None` elsewhere.
    fn reachable_in(
        &self,
        metrics: &openraft::RaftMetrics<TypeConfig>,
    ) -> Option<BTreeSet<NodeId>> {
        let within = Duration::from_millis(self.raft.config().election_timeout_max);
        metrics.heartbeat.as_ref().map(|acknowledged| {
            acknowledged
                .iter()
                .filter(|(_, at)| {
                    at.as_ref()
                        .is_some_and(|at| openraft::Instant::elapsed(&**at) <= within)
                })
                .map(|(id, _)| *id)
                .chain([self.id])
                .collect()
        })
    }

    /// Waits, on the leader, for at most two maximum election timeouts,
    /// until a majority of `voters` is reachable
    /// ([`MembershipView::reachable`]); whether it is. A leader elected a
    /// moment ago has heard no heartbeat answered yet.
    pub async fn wait_for_reachable_quorum(&self, voters: &BTreeSet<NodeId>) -> bool {
        let timeout =
            Duration::from_millis(self.raft.config().election_timeout_max).saturating_mul(2);
        self.raft
            .wait(Some(timeout))
            .metrics(
                |metrics| {
                    self.reachable_in(metrics).is_some_and(|reachable| {
                        let running = voters.intersection(&reachable).count();
                        !voters.is_empty() && running > voters.len() / 2
                    })
                },
                "a quorum of voters to answer heartbeats",
            )
            .await
            .is_ok()
    }

    /// Makes `change` if the membership is still `decided_on`. Refusals
    /// made before anything was proposed: [`MemberChangeError::Changed`]
    /// (decide again), or [`WriteError::NotLeader`] for a learner's entry.
    /// A promotion is two entries, so once openraft has it, a failure is
    /// [`WriteError::Unavailable`] (it may be partly made).
    pub async fn change_member_if(
        &self,
        change: MemberChange,
        decided_on: &MembershipVersion,
    ) -> Result<(), MemberChangeError> {
        self.leading()?;
        self.wait_until_established().await;
        let guard = Precondition::LastMembershipLogId {
            last_membership_log_id: decided_on.0,
        };
        let (members, single_entry) = match change {
            MemberChange::AddLearner { id, info } => {
                (ChangeMembers::AddNodes(BTreeMap::from([(id, info)])), true)
            }
            MemberChange::Promote { id } => {
                (ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            }
            MemberChange::SetAddresses { id, info } => {
                (ChangeMembers::SetNodes(BTreeMap::from([(id, info)])), true)
            }
            MemberChange::RemoveLearner { id } => {
                (ChangeMembers::RemoveNodes(BTreeSet::from([id])), true)
            }
        };
        let written = self.raft.change_membership_if(members, true, [guard]).await;
        let error = match written {
            Ok(_) => return Ok(()),
            Err(error) => error,
        };
        // Refused before the first entry: the guard failed (the first
        // entry's guard is the one given; a second entry's names the joint
        // entry), or another change is not committed yet.
        if let RaftError::APIError(api) = &error {
            match api {
                ClientWriteError::PreconditionFailed(
                    PreconditionFailed::LastMembershipLogIdMismatch { expected, .. },
                ) if *expected == decided_on.0 => {
                    return Err(MemberChangeError::Changed(api.to_string()));
                }
                ClientWriteError::ChangeMembershipError(
                    ChangeMembershipError::InProgress(_)
                    | ChangeMembershipError::UncommittedLeaderLog(_),
                ) => return Err(MemberChangeError::Changed(api.to_string())),
                _ => {}
            }
        }
        Err(MemberChangeError::Write(if single_entry {
            write_error(error)
        } else {
            write_error_after_proposing(error)
        }))
    }

    /// Asks this node, the leader, to hand leadership to voter `to` (which
    /// takes it if its log is up to date); [`Consensus::wait_for_leader`]
    /// tells when it has. A node that does not lead refuses before asking.
    pub async fn transfer_leader(&self, to: NodeId) -> Result<(), WriteError> {
        self.leading()?;
        self.raft
            .trigger()
            .transfer_leader(to)
            .await
            .map_err(|fatal| WriteError::Unavailable(fatal.to_string()))
    }

    /// Waits, at most three maximum election timeouts, until this node,
    /// if it leads, has applied an entry of its own term (the blank entry
    /// a new leader appends): until then openraft may refuse a membership
    /// change of a leader just elected (a member handing leadership over
    /// forwards the change that removes it at once). Returns at once on a
    /// node that does not lead.
    async fn wait_until_established(&self) {
        let timeout =
            Duration::from_millis(self.raft.config().election_timeout_max).saturating_mul(3);
        let established = self
            .raft
            .wait(Some(timeout))
            .metrics(
                |metrics| {
                    metrics.state != ServerState::Leader
                        || metrics.last_applied.as_ref().is_some_and(|applied| {
                            applied.leader_id.term == metrics.vote.leader_id().term
                        })
                },
                "the leader to apply an entry of its term",
            )
            .await;
        if established.is_err() {
            tracing::debug!("the leader has applied no entry of its term yet");
        }
    }

    /// Waits until this node knows a leader (itself or another it hears
    /// from: [`Consensus::leadership`]), for at most three maximum election
    /// timeouts; whether it does.
    pub async fn wait_for_a_leader(&self) -> bool {
        let timeout =
            Duration::from_millis(self.raft.config().election_timeout_max).saturating_mul(3);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.leadership().leader_id.is_some() {
                return true;
            }
            // A leader's messages are noted outside openraft's metrics:
            // asked again at the heartbeat's pace.
            let heartbeat = Duration::from_millis(self.raft.config().heartbeat_interval);
            let next = tokio::time::Instant::now() + heartbeat.max(Duration::from_millis(10));
            if next > deadline {
                return false;
            }
            tokio::time::sleep_until(next).await;
        }
    }

    /// Waits until this node sees `leader` lead, for at most three maximum
    /// election timeouts; whether it did.
    pub async fn wait_for_leader(&self, leader: NodeId) -> bool {
        let timeout =
            Duration::from_millis(self.raft.config().election_timeout_max).saturating_mul(3);
        self.raft
            .wait(Some(timeout))
            .metrics(
                |metrics| metrics.current_leader == Some(leader),
                "the leadership transfer",
            )
            .await
            .is_ok()
    }

    /// Whether enough bytes were applied since the last snapshot that one
    /// is due ([`ConsensusOptions::snapshot_after_bytes`]), or enough
    /// entries while openraft's own policy would not ask again soon (it
    /// asks once per `snapshot_after_entries`, and a snapshot put off
    /// while another was sent to a peer is asked for again here).
    pub fn snapshot_due(&self) -> bool {
        let (bytes, applied) = {
            let state = self.state.lock();
            (
                state.bytes_since_snapshot,
                state.last_applied.map_or(0, |id| id.index),
            )
        };
        if bytes >= self.snapshot_after_bytes {
            return true;
        }
        let metrics = self.raft.metrics();
        let metrics = openraft::async_runtime::WatchReceiver::borrow_watched(&metrics);
        let snapshot = metrics.snapshot.as_ref().map_or(0, |id| id.index);
        applied.saturating_sub(snapshot) >= self.snapshot_after_entries
    }

    /// Asks consensus to take a snapshot now.
    pub async fn trigger_snapshot(&self) -> Result<(), WriteError> {
        self.raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| WriteError::Unavailable(e.to_string()))
    }

    /// Stops consensus.
    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::error::ForwardToLeader;

    fn leader_two() -> NodeInfo {
        NodeInfo {
            peer_address: "127.0.0.1:2".to_string(),
            client_address: "127.0.0.1:3".to_string(),
        }
    }

    fn refused(forward: ForwardToLeader<TypeConfig>) -> ClientWriteError<TypeConfig> {
        ClientWriteError::ForwardToLeader(forward)
    }

    #[test]
    fn only_a_refusal_before_appending_is_not_the_leader() {
        assert_eq!(
            client_write_error(refused(ForwardToLeader::new(2, leader_two()))),
            WriteError::NotLeader {
                leader_id: Some(2),
                leader: Some(leader_two()),
            }
        );
        assert_eq!(
            client_write_error(refused(ForwardToLeader::empty())),
            WriteError::NotLeader {
                leader_id: None,
                leader: None,
            }
        );
        // Appended, then discarded by a leader change: it may still commit.
        let discarded = client_write_error(ClientWriteError::LogEntryDiscarded(
            ForwardToLeader::new(2, leader_two()),
        ));
        assert!(
            matches!(discarded, WriteError::Unavailable(_)),
            "{discarded:?}"
        );
    }

    #[test]
    fn a_membership_change_refused_after_part_of_it_was_proposed_is_unavailable() {
        for forward in [
            ForwardToLeader::new(2, leader_two()),
            ForwardToLeader::empty(),
        ] {
            let first = write_error(RaftError::APIError(refused(forward.clone())));
            assert!(matches!(first, WriteError::NotLeader { .. }), "{first:?}");
            let later = write_error_after_proposing(RaftError::APIError(refused(forward)));
            assert!(matches!(later, WriteError::Unavailable(_)), "{later:?}");
        }
        let stopped =
            write_error_after_proposing(RaftError::Fatal(openraft::error::Fatal::Stopped));
        assert!(matches!(stopped, WriteError::Unavailable(_)), "{stopped:?}");
    }
}
